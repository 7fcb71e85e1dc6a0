"""Issue 38: files from elsewhere (config.json, measured and learned profiles, replay tables, the
profile cache) cannot steer, hang or lock out a sweep. Each case is a hostile file the adversarial
pass made; each must be one line naming the file and the field (exit 2), or be used harmlessly."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import yaml

from sweeper.errors import SpecError, SweepError
from sweeper.files import FileRefused, parse_json, parse_yaml, read_limited
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec
from tests.test_hf_config import LLAMA31_8B, QWEN15_MOE_A27B


def hf_sweep(tmp_path: Path, config: dict | str | None = None):
    if config is not None:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(base_spec(model={"hf_config": "config.json"}, space={"tp": [1]})))
    return load_sweep(path)


# ---- the one reader ----------------------------------------------------------------------------
def test_a_device_or_fifo_is_refused_before_it_is_read(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    for name, kind in (("zero", "a character device"), ("fifo", "a FIFO")):
        done: list[str] = []
        reader = threading.Thread(target=lambda n=name, out=done: out.append(_refusal(tmp_path / n)), daemon=True)
        reader.start()
        reader.join(5)
        assert done, f"reading {name} did not end"
        assert done[0] == f"{tmp_path / name}: {kind}; only a regular file is read here"


def _refusal(path: Path) -> str:
    try:
        read_limited(path, max_bytes=1 << 20)
    except FileRefused as e:
        return str(e)
    return "read"


def test_the_size_is_bounded_before_reading(tmp_path):
    big = tmp_path / "sparse.json"
    with open(big, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes: reading it all took 15 s and 3.2 GB
    start = time.monotonic()
    with pytest.raises(FileRefused, match=r"3221225472 bytes; at most 1048576 are read here"):
        read_limited(big, max_bytes=1 << 20)
    assert time.monotonic() - start < 1


def test_json_numbers_keys_and_depth_are_bounded(tmp_path):
    p = tmp_path / "c.json"
    cases = {
        '{"a": 1' + "0" * 5000 + "}": "a: an integer of 5001 digits; at most 18",
        '{"a": [1, NaN]}': "a[1]: NaN is not a finite number",
        '{"a": 1e400}': "a: 1e400 is not a finite number",
        '{"a": 1, "a": 2}': "a: given twice; a key may appear once",
        "[" * 200_000 + "]" * 200_000: "nested 200000 levels deep; at most 32",
    }
    for text, message in cases.items():
        with pytest.raises(FileRefused) as info:
            parse_json(text.encode(), p)
        assert str(info.value) == f"{p}: {message}"


def test_yaml_numbers_and_keys_are_bounded():
    for text, message in {
        "a: 1" + "0" * 400: "a: an integer of 401 digits; at most 18",
        "a: [1.0, .inf]": "item 2: .inf is not a finite number",
        "a: 1.0e+400": "a: 1.0e+400 is not a finite number",
        "a: 1\na: 2": "duplicate key 'a'",
    }.items():
        with pytest.raises(FileRefused, match=re.escape(message)):
            parse_yaml(text, "f.yaml")


# ---- model: {hf_config: ...} ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        # 2.3 GB and growing after 40 s: the per-layer loop ran before the layer limit
        ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers = 1000000000; allowed: 1 to 100000"),
        ({"mlp_only_layers": 5}, "mlp_only_layers must be a list of block numbers, got 5"),
        ({"mlp_only_layers": [[1]]}, "mlp_only_layers must be a list of block numbers, got [[1]]"),
        ({"shared_expert_intermediate_size": "abc"}, "shared_expert_intermediate_size must be a whole number"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size = 0; an expert's MLP is at least 1 wide"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    ],
)
def test_a_hostile_moe_config_is_one_line(tmp_path, change, message):
    start = time.monotonic()
    with pytest.raises(SpecError, match="model.hf_config: .*config.json: ") as info:
        hf_sweep(tmp_path, {**QWEN15_MOE_A27B, **change})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"num_hidden_layers": 1' + "0" * 5000 + "}", "num_hidden_layers: an integer of 5001 digits"),
        ("[" * 200_000 + "]" * 200_000, "nested 200000 levels deep; at most 32"),
        (json.dumps(LLAMA31_8B)[:-1] + ', "vocab_size": 7}', "vocab_size: given twice"),
    ],
)
def test_a_hostile_config_text_is_one_line(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        hf_sweep(tmp_path, text)


def test_a_config_that_is_a_device_or_a_fifo_is_refused(tmp_path):
    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(SpecError, match="config.json: a character device; only a regular file is read here"):
        hf_sweep(tmp_path)
    (tmp_path / "config.json").unlink()
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(SpecError, match="config.json: a FIFO; only a regular file is read here"):
        hf_sweep(tmp_path)


def test_the_config_errors_are_sweep_errors():
    assert issubclass(FileRefused, SweepError) and FileRefused.exit_code == 2

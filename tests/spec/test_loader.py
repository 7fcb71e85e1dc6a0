"""The sweep file: valid files load, and each kind of bad input names the field and what is allowed."""

from __future__ import annotations

import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.spec.loader import find_sweep_file, load_sweep, parse_sweep
from tests.conftest import SPACES, base_spec, make_sweep


def test_shipped_spaces_load():
    names = {p.stem for p in SPACES.glob("*.yaml")}
    assert {"llama13b_2k", "llama13b_8k", "llama30b_2k", "llama30b_8k", "llama65b_2k", "tiny_cpu"} <= names
    for p in SPACES.glob("*.yaml"):
        s = load_sweep(p)
        assert s.name == p.stem


def test_defaults_fill_unlisted_knobs():
    s = make_sweep(space={"tp": [2]})
    assert s.space["tp"] == (2,)
    assert s.space["pp"] == (1,) and s.space["activation_checkpointing"] == ("none",)
    assert s.trial.steps == 10 and s.trial.warmup_steps == 1


def test_scalar_knob_value_is_a_one_element_list():
    assert make_sweep(space={"tp": 4}).space["tp"] == (4,)


def test_explicit_model_and_custom_gpu():
    s = make_sweep(
        model={"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 176, "vocab": 256},
        cluster={"nodes": 1, "gpus_per_node": 2, "gpu": {"memory_gib": 24, "peak_tflops": 100}},
        space={"tp": [1, 2]},
    )
    assert s.model.kv_heads == 2 and s.model.head_dim == 16
    assert s.cluster.gpu.memory_gib == 24 and s.cluster.gpu.peak_flops("bf16") == 100e12


def test_find_by_bare_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_sweep_file("llama13b_2k").name == "llama13b_2k.yaml"
    assert find_sweep_file("llama13b_2k.yaml").name == "llama13b_2k.yaml"
    (tmp_path / "llama13b_2k.yaml").write_text(yaml.safe_dump(base_spec(name="mine")))
    assert load_sweep("llama13b_2k.yaml").name == "mine"  # the current directory wins


BAD = [
    # (what is wrong, the override, words the message must contain)
    (
        "unknown knob",
        {"space": {"tp": [1], "warp_drive": [1, 2]}},
        ["space.warp_drive", "unknown field", "micro_batch_size"],
    ),
    ("unknown top-level field", {"nodes": 3}, ["nodes", "unknown field", "cluster"]),
    ("negative size", {"seq_len": -5}, ["seq_len", "greater than or equal to 1"]),
    ("zero batch", {"global_batch_size": 0}, ["global_batch_size"]),
    ("unknown GPU", {"cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "v100"}}, ["cluster.gpu", "v100", "a100-80gb"]),
    ("unknown preset", {"model": "llama-99b"}, ["model", "llama-99b", "llama-13b"]),
    ("bad knob value", {"space": {"attention": ["flash9"]}}, ["space.attention", "flash9", "flash2"]),
    ("wrong type", {"space": {"tp": ["two"]}}, ["space.tp", "integer"]),
    ("tp no layout can use", {"space": {"tp": [3]}}, ["space.tp", "3", "heads = 40"]),
    (
        "tp beyond a node",
        {"cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "a100-80gb"}, "space": {"tp": [8]}},
        ["space.tp", "gpus_per_node = 4"],
    ),
    ("pp beyond layers", {"space": {"pp": [64]}}, ["space.pp", "layers=40"]),
    ("missing field", {"seq_len": None}, ["seq_len"]),
    ("warmup too long", {"trial": {"steps": 3, "warmup_steps": 3}}, ["trial", "warmup_steps must be smaller"]),
    ("unsafe name", {"name": "../etc"}, ["name", "folder name"]),
    ("duplicate value", {"space": {"tp": [2, 2]}}, ["space.tp", "twice"]),
    (
        "heads not multiple of kv",
        {"model": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 3, "ffn": 8, "vocab": 8}},
        ["model", "kv_heads"],
    ),
    ("launcher with shell", {"launcher": "slurm; rm -rf /"}, ["launcher", "profile name"]),
]


@pytest.mark.parametrize("what,override,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_field(what, override, words):
    spec = base_spec(**override)
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(SpecError) as e:
        parse_sweep(yaml.safe_dump(spec))
    for w in words:
        assert w in str(e.value), f"{what}: {w!r} not in {e.value}"


@pytest.mark.parametrize(
    "text,words",
    [
        (b"name: [unclosed", ["invalid YAML"]),
        (b"\xff\xfe\x00bad", ["not UTF-8"]),
        (b"- just\n- a list\n", ["expected a mapping"]),
        (b"a: &x [1, 2]\nb: *x\n", ["aliases"]),
        (b"x" * (2 << 20), ["bytes"]),
    ],
)
def test_unreadable_files(text, words):
    with pytest.raises(SpecError) as e:
        parse_sweep(text, source="f.yaml")
    for w in words:
        assert w in str(e.value)
    assert str(e.value).startswith("f.yaml:")


def test_missing_file_lists_shipped_spaces():
    with pytest.raises(SpecError, match="llama13b_2k"):
        find_sweep_file("no_such_sweep")


KNOB_NAMES = (
    "tp, pp, micro_batch_size, sequence_parallel, activation_checkpointing, attention, rmsnorm, sharding, "
    "pp_schedule, virtual_stages, compile, float8, cp, ep, etp"
)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"space": None}, f"space: must be a mapping of knob: [values] ({KNOB_NAMES}), got nothing"),
        ({"space": [1, 2]}, f"space: must be a mapping of knob: [values] ({KNOB_NAMES}), got a list"),
        (
            {"trial": 3},
            "trial: must be a mapping of fields (steps, warmup_steps, timeout_min, precision, seed, lr), got 3",
        ),
        (
            {"model": None},
            "model: must be a preset name, a mapping of the shape (layers, hidden, heads, ffn, vocab, ...), "
            "or {hf_config: path}",
        ),
        ({"model": {"hf_config": "c.json", "layers": 2}}, "model.layers: unknown field; allowed: hf_config"),
    ],
)
def test_a_section_that_is_not_a_mapping_is_one_line_naming_it(override, message):
    with pytest.raises(SpecError) as info:
        parse_sweep(yaml.safe_dump(base_spec(**override)))
    assert str(info.value) == f"<sweep file>: {message}"
    assert "instance of" not in str(info.value)

"""Exports never drop the model or a knob silently: every model field (shape, RoPE theta and
scaling, positions, norm and its epsilon, biases, tied embeddings, vocab) is the trainer's own
option or named in a comment, read back with each format's parser and compared field by field;
FSDP, which nanotron cannot run, is refused in one line naming sharding."""

from __future__ import annotations

import json
import shlex
import tarfile
import tomllib

import pytest
import yaml

from sweeper.errors import SweepError
from sweeper.spec.loader import parse_sweep
from sweeper.trainers import EXPORTERS
from sweeper.trainers.export_model import model_fields
from sweeper.trainers.nanotron import NANOTRON_COMMIT
from tests.conftest import ROOT, missing_reference
from tests.trainers.test_export_parsers import run_harness

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "rope_type": "llama3",
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
}
ROW = {
    "tp": 2,
    "pp": 2,
    "micro_batch_size": 1,
    "activation_checkpointing": "selective",
    "sharding": "zero1",
    "compile": True,
    "sequence_parallel": True,
    "dp": 16,
    "grad_accum": 64,
    "trial_number": 3,
    "mfu": 0.4,
    "num_devices": 64,
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    spec = {
        "name": "l31",
        "model": {"hf_config": str(folder / "config.json")},
        "seq_len": 4096,
        "global_batch_size": 1024,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {
            "tp": [2],
            "pp": [2],
            "activation_checkpointing": ["selective"],
            "sharding": ["zero1"],
            "compile": [True],
            "sequence_parallel": [True],
        },
    }
    return parse_sweep(yaml.safe_dump(spec))


def _comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def test_the_model_fields_come_from_config_json(sweep):
    f = model_fields(sweep)
    assert (f["rope_theta"], f["norm_eps"], f["max_positions"], f["vocab"]) == (500000.0, 1e-5, 131072, 128256)
    assert f["rope_scaling"]["rope_type"] == "llama3" and f["tied_embeddings"] is False


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_yaml_and_json_hold_every_model_field(sweep, fmt):
    text = EXPORTERS[fmt](ROW, sweep)
    got = (yaml.safe_load if fmt == "yaml" else json.loads)(text)
    assert got["model_shape"] == model_fields(sweep)


@pytest.mark.parametrize("fmt", ["torchtitan", "torchtitan-cli"])
def test_torchtitan_names_every_model_field_and_dropped_knob(sweep, fmt):
    text = EXPORTERS[fmt](ROW, sweep)
    if fmt == "torchtitan":
        tomllib.loads(text)  # still a TOML its loader reads
    notes = _comments(text)
    for field in (
        "rope_theta=500000",
        "norm_eps=1e-05",
        "max_positions=131072",
        "vocab=128256",
        "tied_embeddings=false",
        "rope_scaling={factor: 8",
        "kv_heads=8",
        "ffn=14336",
    ):
        assert field in notes, (fmt, field, notes)


def test_megatron_names_the_model_as_its_own_flags(sweep):
    text = EXPORTERS["megatron"](ROW, sweep)
    line = next(x for x in text.splitlines() if x.startswith("# the model (add to your command): "))
    argv = shlex.split(line.split(": ", 1)[1])
    flags = {
        a: argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
        for i, a in enumerate(argv)
        if a.startswith("--")
    }
    assert flags["--rotary-base"] == "500000" and flags["--layernorm-epsilon"] == "1e-05"
    assert flags["--num-query-groups"] == "8" and flags["--vocab-size"] == "128256"
    assert flags["--max-position-embeddings"] == "131072" and flags["--use-rope-scaling"] is True
    assert flags["--rope-scaling-factor"] == "8" and flags["--untie-embeddings-and-output-weights"] is True
    assert flags["--normalization"] == "RMSNorm" and flags["--swiglu"] is True
    assert "compile=true" in _comments(text)


def test_nanotron_sets_the_model_fields_and_names_the_knobs_it_cannot(sweep, tmp_path):
    text = EXPORTERS["nanotron"](ROW, sweep)
    notes = _comments(text).lower()
    assert "activation_checkpointing=selective" in notes and "compile=true" in notes
    archive = ROOT.parent / "shared" / "reference" / "nanotron" / f"nanotron-{NANOTRON_COMMIT[:8]}.tar.gz"
    if not archive.is_file():
        missing_reference(archive, f"nanotron's config code at {NANOTRON_COMMIT[:8]} is not on PyPI")
    pytest.importorskip("dacite")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    (tmp_path / "c.yaml").write_text(text)
    (got,) = run_harness(
        "nanotron_config.py",
        [{"yaml": str(tmp_path / "c.yaml")}],
        pythonpath=str(tmp_path / f"nanotron-{NANOTRON_COMMIT}" / "src"),
    )
    assert got["ok"], got["error"]
    f = model_fields(sweep)
    assert got["model"] == [
        f["layers"],
        f["hidden"],
        f["heads"],
        f["kv_heads"],
        f["ffn"],
        f["vocab"],
        f["tied_embeddings"],
        f["max_positions"],
    ]
    theta, scaling, eps = got["rope"]
    assert (theta, scaling, eps) == (f["rope_theta"], f["rope_scaling"], f["norm_eps"])


def test_nanotron_refuses_fsdp_in_one_line_naming_sharding(sweep):
    with pytest.raises(SweepError, match=r"^sharding=fsdp: nanotron has no FSDP") as e:
        EXPORTERS["nanotron"](ROW | {"sharding": "fsdp"}, sweep)
    assert "\n" not in str(e.value)


def test_a_preset_says_which_fields_take_the_trainers_default():
    from tests.conftest import make_sweep

    text = EXPORTERS["torchtitan"](ROW | {"dp": 4, "grad_accum": 256}, make_sweep())
    assert "rope_theta" in _comments(text) and "not given by the sweep's model (no config.json)" in _comments(text)

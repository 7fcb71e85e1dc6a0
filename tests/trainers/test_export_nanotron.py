"""`sweep best --format nanotron`, loaded by nanotron's own config code over a grid of layouts.

nanotron's `get_config_from_file` (src/nanotron/config/config.py at c2528430, the commit the
Ultra-Scale Playbook sweep ran) builds its dataclasses with dacite, strict: an unknown, missing or
mistyped field is refused. The PyPI release (0.4, March 2024) predates this schema, so the source is
the `git archive` of that commit kept beside the repository in
../shared/reference/nanotron/ (its README says why); without dacite (the `test` extra) the test
skips saying so; without the archive it skips too, except in CI (`CI=true`), where it fails:
CI runs every reference case (tests.conftest.missing_reference). The harness (tests/parsers/nanotron_config.py) runs once, in a
subprocess, for the whole grid.
"""

from __future__ import annotations

import importlib.util
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.errors import SweepError
from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Layout
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep
from sweeper.trainers.export import layout_record
from sweeper.trainers.nanotron import NANOTRON_COMMIT, RUN_PLACEHOLDERS, to_nanotron
from tests.conftest import ROOT, base_spec, missing_reference
from tests.trainers.test_export_parsers import run_harness

ARCHIVE = ROOT.parent / "shared" / "reference" / "nanotron" / f"nanotron-{NANOTRON_COMMIT[:8]}.tar.gz"
WORLD = 64


def sweep_of(layers: int, **extra: Any) -> Sweep:
    model = {"layers": layers, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256}
    workload = {"kind": "nanotron", "command": "torchrun run_train.py --config-file cfg.yaml"}
    spec = base_spec(
        model=model, cluster={"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"}, workload=workload, **extra
    )
    return parse_sweep(yaml.safe_dump(spec))


def grid() -> list[tuple[str, Sweep, Layout]]:
    """tp x pp x sharding x schedule, with checkpointing, sp and micro-batches cycling: every
    layout the nanotron trainer's rules allow (the others are the plan's, not the export's)."""
    s32, s30 = sweep_of(32), sweep_of(30, seq_len=4096, global_batch_size=256, trial={"precision": "fp32"})
    cases = []
    i = 0
    for sweep in (s32, s30):
        for tp, pp in ((1, 1), (2, 1), (8, 1), (1, 2), (2, 4), (8, 8), (4, 2)):
            for sharding in ("none", "zero1"):
                for schedule in ("1f1b", "gpipe") if pp > 1 else ("1f1b",):
                    i += 1
                    lay = Layout(
                        tp=tp,
                        pp=pp,
                        sharding=sharding,
                        pp_schedule=schedule,
                        micro_batch_size=1 + i % 2,
                        sequence_parallel=tp > 1 and i % 2 == 0,
                        activation_checkpointing=("none", "full")[i % 2],
                    )
                    assert lay.rejection(sweep) is None, lay
                    name = f"L{sweep.model.layers}-" + "-".join(f"{k}={getattr(lay, k)}" for k in KNOBS)
                    cases.append((name, sweep, lay))
    return cases


GRID = grid()
IDS = [c[0] for c in GRID]


def record(sweep: Sweep, lay: Layout) -> dict[str, Any]:
    return layout_record(lay.resolve(sweep).as_fields() | {"trial_number": 1, "mfu": 0.4}, sweep)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if importlib.util.find_spec("dacite") is None:
        pytest.skip("dacite is not installed (pip install -e '.[test]'): nanotron's config loader needs it")
    if not ARCHIVE.is_file():
        missing_reference(ARCHIVE, f"nanotron's config code at {NANOTRON_COMMIT[:8]} is not on PyPI")
    src = tmp_path_factory.mktemp("nanotron")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(src, filter="data")
    out = tmp_path_factory.mktemp("yaml")
    cases = []
    for i, (_, sweep, lay) in enumerate(GRID):
        path = out / f"{i}.yaml"
        path.write_text(to_nanotron(record(sweep, lay), sweep))
        cases.append({"yaml": str(path)})
    # a field nanotron does not have: its loader must refuse it (the check can fail)
    bad = yaml.safe_load(to_nanotron(record(*GRID[0][1:]), GRID[0][1]))
    bad["parallelism"]["recompute_layers"] = True
    (out / "bad.yaml").write_text(yaml.safe_dump(bad))
    cases.append({"yaml": str(out / "bad.yaml")})
    # a model read from a config.json: its own token ids, norm epsilon and RoPE reach nanotron
    hf = hf_sweep(out)
    (out / "hf.yaml").write_text(to_nanotron(record(hf, Layout(tp=2, pp=2)), hf))
    cases.append({"yaml": str(out / "hf.yaml")})
    answers = run_harness("nanotron_config.py", cases, pythonpath=str(src / f"nanotron-{NANOTRON_COMMIT}" / "src"))
    return dict(zip([*IDS, "bad", "hf"], answers))


LLAMA31 = {  # Llama 3.1 8B Instruct's config.json, the fields the model and the export read
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "tie_word_embeddings": False,
}


def hf_sweep(folder: Path) -> Sweep:
    """A nanotron sweep whose model is LLAMA31, read from a config.json in `folder`."""
    (folder / "config.json").write_text(json.dumps(LLAMA31))
    workload = {"kind": "nanotron", "command": "torchrun run_train.py --config-file cfg.yaml"}
    spec = base_spec(
        model={"hf_config": str(folder / "config.json")},
        seq_len=4096,
        global_batch_size=256,
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        workload=workload,
    )
    return parse_sweep(yaml.safe_dump(spec))


@pytest.mark.parametrize("name", IDS, ids=IDS)
def test_nanotron_loads_the_export(loaded, name):
    _, sweep, lay = GRID[IDS.index(name)]
    got = loaded[name]
    assert got["ok"], got["error"]
    rec = record(sweep, lay)
    assert (got["dp"], got["tp"], got["pp"]) == (rec["dp"], rec["tp"], rec["pp"])
    assert got["dp"] * got["tp"] * got["pp"] == WORLD
    engines = {"1f1b": "OneForwardOneBackwardPipelineEngine", "gpipe": "AllForwardAllBackwardPipelineEngine"}
    assert got["pp_engine"] == engines[rec["pp_schedule"]]
    sp = rec["tp"] > 1 and rec["sequence_parallel"]
    assert got["tp_mode"] == ("REDUCE_SCATTER" if sp else "ALL_REDUCE") and got["async"] == sp
    assert got["recompute_layer"] == (rec["activation_checkpointing"] == "full")
    assert (got["sequence_length"], got["micro_batch_size"], got["grad_accum"]) == (
        sweep.seq_len,
        rec["micro_batch_size"],
        rec["grad_accum"],
    )
    assert got["global_batch_size"] == sweep.global_batch_size  # nanotron's mbs x accumulation x dp
    assert got["zero_stage"] == {"none": 0, "zero1": 1}[rec["sharding"]] and got["fp32_grads"]
    assert got["dtype"] == ("torch.float32" if sweep.trial.precision == "fp32" else "torch.bfloat16")
    m = sweep.model
    assert got["model_class"] == "LlamaConfig"
    assert got["model"] == [m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, m.tied_embeddings, sweep.seq_len]
    assert got["dummy_data"]


def test_nanotron_refuses_a_field_it_lacks(loaded):
    assert not loaded["bad"]["ok"] and "recompute_layers" in loaded["bad"]["error"]


def test_the_config_json_reaches_nanotron(loaded):
    """The model's own bos/eos ids (nanotron's LlamaConfig defaults are 1 and 2), norm epsilon and
    RoPE, as nanotron's loader builds them; of Llama 3.1's three eos ids the first, said so."""
    got = loaded["hf"]
    assert got["ok"], got["error"]
    assert got["tokens"] == [128000, 128001, None]
    assert got["rope"] == [500000.0, {"factor": 8.0, "rope_type": "llama3"}, 1e-5]


def test_the_eos_list_is_named(tmp_path):
    sweep = hf_sweep(tmp_path)
    text = to_nanotron(record(sweep, Layout(tp=2, pp=2)), sweep)
    assert "eos_token_id=[128001, 128008, 128009]: nanotron takes one id; the first, 128001, written" in text


def test_the_run_values_are_placeholders():
    """train_steps (the trial's 10), the warm-up, learning rate, tokenizer and dataset belong to the
    user's run: each line says so; no layout value is marked."""
    sweep, lay = GRID[0][1:]
    lines = to_nanotron(record(sweep, lay), sweep).splitlines()
    marked = {ln.strip().split(":", 1)[0]: ln for ln in lines if "# placeholder:" in ln and not ln.startswith("#")}
    assert set(marked) == set(RUN_PLACEHOLDERS)
    assert marked["train_steps"].startswith(f"  train_steps: {sweep.trial.steps}  # placeholder:")
    assert yaml.safe_load("\n".join(lines))["tokens"]["train_steps"] == sweep.trial.steps


def test_an_interleaved_layout_is_refused():
    """nanotron's engines are 1f1b and afab (cast_str_to_pipeline_engine): an interleaved layout is
    refused in one line, never written as `pp_engine: interleaved`."""
    sweep = sweep_of(32)
    lay = Layout(tp=2, pp=2, pp_schedule="interleaved", virtual_stages=2)
    with pytest.raises(SweepError) as e:
        to_nanotron(record(sweep, lay), sweep)
    assert "\n" not in str(e.value) and "pp_schedule=interleaved: nanotron has no interleaved" in str(e.value)


def test_the_archive_is_the_pinned_commit():
    if not ARCHIVE.is_file():
        missing_reference(ARCHIVE, f"the git archive of nanotron at {NANOTRON_COMMIT[:8]}")
    with tarfile.open(ARCHIVE) as tar:
        names = tar.getnames()
    assert f"nanotron-{NANOTRON_COMMIT}/src/nanotron/config/config.py" in names
    assert Path(names[0]).parts[0] == f"nanotron-{NANOTRON_COMMIT}"

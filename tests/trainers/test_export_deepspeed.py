"""`sweep best --format deepspeed` and the trial's ds_config.json, read back by DeepSpeed's own
`DeepSpeedConfig` (deepspeed/runtime/config.py of the release the export names) over a grid of
layouts, field by field; and the layouts DeepSpeed's engines refuse, refused by the plan.

The `deepspeed` package comes with the `test` extra (its CPU install builds no ops); without it the
config test skips saying so. The harness (tests/parsers/deepspeed_config.py) runs once, in a
subprocess, for the whole grid.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.layouts.layout import Layout
from sweeper.runtime.workloads import render_command
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep
from sweeper.statuses import PlanReason
from sweeper.trainers import TRAINERS
from sweeper.trainers.deepspeed import DEEPSPEED_VERSION, to_deepspeed
from sweeper.trainers.export import layout_record
from tests.conftest import base_spec
from tests.trainers.test_export_parsers import run_harness

COMMAND = "deepspeed train.py --tp {tp} --pp {pp} --deepspeed_config {workdir}/ds_config.json"


def sweep_of(memory: dict[str, Any] | None = None, precision: str = "bf16") -> Sweep:
    """Llama-8B's shape on 4 nodes of 8 H100, 256 sequences of 4096, as a DeepSpeed workload."""
    model = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256}
    extra: dict[str, Any] = {"memory": {"recipe": "deepspeed", **memory}} if memory else {}
    spec = base_spec(
        model=model,
        seq_len=4096,
        global_batch_size=256,
        cluster={"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm"},
        workload={"kind": "deepspeed", "command": COMMAND},
        trial={"precision": precision},
        **extra,
    )
    return parse_sweep(yaml.safe_dump(spec))


def grid() -> list[tuple[str, Sweep, Layout]]:
    """sharding x pp x checkpointing x precision, and the ZeRO stage and gradient dtype given in
    `memory:`: every layout the deepspeed trainer's rules allow."""
    plain, fp32 = sweep_of(), sweep_of(precision="fp32")
    stage2, fp32_grads = sweep_of({"zero_stage": 2}), sweep_of({"grad_accum_dtype": "fp32"})
    cases = []
    for sweep, tag in ((plain, "bf16"), (fp32, "fp32"), (stage2, "stage2"), (fp32_grads, "fp32grads")):
        for pp in (1, 2, 4):
            for sharding in ("none", "zero1", "fsdp"):
                for i, mode in enumerate(("none", "full", "selective")):
                    lay = Layout(
                        tp=2, pp=pp, sharding=sharding, activation_checkpointing=mode, micro_batch_size=1 + i % 2
                    )
                    if lay.rejection(sweep) is None:
                        cases.append((f"{tag}-pp{pp}-{sharding}-{mode}", sweep, lay))
    return cases


GRID = grid()
IDS = [c[0] for c in GRID]


def record(sweep: Sweep, lay: Layout) -> dict[str, Any]:
    return layout_record(lay.resolve(sweep).as_fields() | {"trial_number": 3, "mfu": 0.41}, sweep)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install -e '.[test]'): its DeepSpeedConfig reads the exports")
    out = tmp_path_factory.mktemp("ds")
    cases = []
    for i, (_, sweep, lay) in enumerate(GRID):
        path = out / f"{i}.json"
        path.write_text(to_deepspeed(record(sweep, lay), sweep))
        cases.append({"path": str(path), "dp": record(sweep, lay)["dp"]})
    # the same file with another data-parallel size: DeepSpeed must refuse its batch (the check can fail)
    cases.append({"path": cases[0]["path"], "dp": cases[0]["dp"] * 2})
    answers = run_harness("deepspeed_config.py", cases)
    return dict(zip([*IDS, "wrong dp"], answers))


def test_the_grid_covers_every_stage():
    stages = {(json.loads(to_deepspeed(record(s, lay), s))["zero_optimization"]["stage"]) for _, s, lay in GRID}
    assert stages == {0, 1, 2, 3} and len(GRID) >= 30


@pytest.mark.parametrize("name", IDS, ids=IDS)
def test_deepspeed_reads_the_export(loaded, name):
    _, sweep, lay = GRID[IDS.index(name)]
    got, rec = loaded[name], record(sweep, lay)
    assert got["ok"], got["error"]
    assert got["world_size"] == rec["dp"]
    assert (got["train_batch_size"], got["micro_batch"], got["grad_accum"]) == (
        256,
        rec["micro_batch_size"],
        rec["grad_accum"],
    )
    assert got["train_batch_size"] == got["micro_batch"] * got["grad_accum"] * rec["dp"]
    given = sweep.memory.zero_stage if rec["sharding"] != "none" else None  # type: ignore[union-attr]
    stage = given if given is not None else {"none": 0, "zero1": 1, "fsdp": 3}[rec["sharding"]]
    assert got["zero_stage"] == stage
    if stage > 0:  # the buckets the memory recipe counts
        assert got["reduce_bucket_size"] == 5e8
    if stage == 3:
        assert got["prefetch_bucket_size"] == 5e7
    assert (got["bf16"], got["fp16"]) == (sweep.trial.precision == "bf16", False)
    grads = sweep.memory.grad_accum_dtype or sweep.trial.precision  # type: ignore[union-attr]
    assert got["grad_accum_dtype"] == grads
    assert got["checkpointing"] == (rec["activation_checkpointing"] != "none") and not got["partition_activations"]
    interval = int(rec["activation_checkpointing"] == "full") if rec["pp"] > 1 else 0
    assert got["pipeline"]["activation_checkpoint_interval"] == interval
    assert got["pipeline"]["stages"] == (rec["pp"] if rec["pp"] > 1 else "auto")


def test_deepspeed_refuses_another_batch(loaded):
    assert not loaded["wrong dp"]["ok"] and "train_batch_size is not equal" in loaded["wrong dp"]["error"]


def test_the_installed_release_is_the_one_named():
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install -e '.[test]')")
    assert importlib.metadata.version("deepspeed") == DEEPSPEED_VERSION


def test_the_export_says_where_it_comes_from_and_what_the_script_decides():
    sweep = sweep_of()
    d = json.loads(to_deepspeed(record(sweep, Layout(tp=2, pp=2, activation_checkpointing="selective")), sweep))
    assert d["_sweep"]["source"].startswith("sweep t, trial 3, MFU 41.00%, chosen for 4 node(s)")
    notes = " | ".join(d["_sweep"]["not_in_ds_config"])
    assert "tp=2" in notes and "PipelineModule(num_stages=2" in notes
    assert "selective: the script wraps the attention's cheap ops in deepspeed.checkpointing.checkpoint" in notes
    assert "BF16_Optimizer" in notes  # stage 0 under a pipeline runs another optimizer than the one counted


def test_each_trial_gets_its_ds_config(tmp_path: Path):
    """The trial's folder gets the file the export prints, at the path the command names."""
    sweep, lay = GRID[0][1:]
    rec = record(sweep, lay)
    files = TRAINERS["deepspeed"].files(rec, sweep)
    assert files == {"ds_config.json": to_deepspeed(rec, sweep)}
    argv = render_command(sweep.workload.command, sweep, lay, "deepspeed", tmp_path)
    assert argv[-2:] == ["--deepspeed_config", f"{tmp_path}/ds_config.json"]


# ---- the plan: what DeepSpeed's engines assert ----------------------------------------------
def _reason(sweep: Sweep, **knobs: Any) -> tuple[str | None, str]:
    rejection = Layout(**knobs).rejection(sweep)
    return (None, "") if rejection is None else (rejection.code.value, rejection.message)


@pytest.mark.parametrize(
    ("memory", "knobs", "code", "why"),
    [
        # pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        (None, {"tp": 2, "pp": 2, "sharding": "fsdp"}, "combination_not_in_trainer", "pp = 2 with ZeRO stage 3"),
        ({"zero_stage": 2}, {"pp": 4, "sharding": "zero1"}, "combination_not_in_trainer", "ZeRO stage 2"),
        (None, {"tp": 2, "pp": 2, "sharding": "zero1"}, None, ""),  # ZeRO-1 runs with a pipeline
        (None, {"tp": 2, "pp": 1, "sharding": "fsdp"}, None, ""),  # ZeRO-3 without one
        ({"zero_stage": 2}, {"pp": 1, "sharding": "zero1"}, None, ""),
        # engine.py: "unsupported mix of model_dtype and grad_accum_dtype" without ZeRO
        ({"grad_accum_dtype": "fp32"}, {"sharding": "none"}, "combination_not_in_trainer", "unsupported mix"),
        ({"grad_accum_dtype": "fp32"}, {"sharding": "zero1"}, None, ""),
        # TrainSchedule is its only training schedule; it runs fewer micro-batches than stages
        (None, {"pp": 4, "pp_schedule": "interleaved", "virtual_stages": 2}, "knob_not_in_trainer", "TrainSchedule"),
        (None, {"pp": 4, "pp_schedule": "gpipe"}, "knob_not_in_trainer", "TrainSchedule"),
        (None, {"pp": 8, "tp": 4, "micro_batch_size": 1}, None, ""),  # dp 1: 256 micro-batches
        (None, {"cp": 2}, "cp_not_in_workload", "Ulysses"),
    ],
)
def test_the_plan_refuses_what_deepspeed_asserts(memory, knobs, code, why):
    got, text = _reason(sweep_of(memory), **knobs)
    assert got == code, text
    assert why in text and "\n" not in text
    if code == PlanReason.COMBINATION_NOT_IN_TRAINER:
        assert text.startswith("the deepspeed trainer cannot run ")


def test_a_short_pipeline_runs():
    """TrainSchedule runs fewer micro-batches than stages (2 on 4 stages): not refused as torch's is."""
    spec = base_spec(global_batch_size=8, workload={"kind": "deepspeed", "command": COMMAND})
    small = parse_sweep(yaml.safe_dump(spec))  # 64 GPUs: tp 8, pp 4, dp 2, micro-batch 2
    assert Layout(pp=4, tp=8, micro_batch_size=2).resolve(small).as_fields()["grad_accum"] == 2
    assert _reason(small, pp=4, tp=8, micro_batch_size=2) == (None, "")
    torchtitan = parse_sweep(yaml.safe_dump(spec | {"workload": {"kind": "torchtitan", "command": "x {flags}"}}))
    assert _reason(torchtitan, pp=4, tp=8, micro_batch_size=2)[0] == "too_few_microbatches"

"""`sweep best --plan`: the layout the plan predicts best, before any trial, in every `--format`,
each marked as predicted, not measured; each format read back with its own parser."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from sweeper.plan.plan import make_plan
from sweeper.spec.loader import load_sweep
from sweeper.statuses import PlanStatus
from tests.conftest import SPACES, sweep_cli

SPEC = str(SPACES / "llama13b_2k.yaml")
MARK = "predicted by the plan, not measured (no trial ran it), predicted MFU"


def first_of_the_dry_run() -> dict:
    """The dry run's first candidate: the best predicted MFU."""
    frame = make_plan(load_sweep(SPEC)).to_frame()
    cands = frame[frame.status == PlanStatus.CANDIDATE].sort_values("pred_mfu", ascending=False, kind="stable")
    return cands.iloc[0].to_dict()


def test_json_is_the_dry_runs_first_layout_marked_predicted(tmp_path):
    r = sweep_cli("best", SPEC, "--plan", "--format", "json", "--top", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    best = first_of_the_dry_run()
    assert doc["predicted"] is True and len(doc["top"]) == 3 and doc["best"] == doc["top"][0]
    layout = doc["layout"]
    assert layout["predicted"] is True and layout["mfu"] is None and layout["trial_number"] is None
    assert layout["pred_mfu"] == pytest.approx(best["pred_mfu"])
    assert {k: layout[k] for k in ("tp", "pp", "micro_batch_size", "attention", "dp", "grad_accum")} == {
        k: best[k] for k in ("tp", "pp", "micro_batch_size", "attention", "dp", "grad_accum")
    }
    assert layout["num_devices"] == 64 and [t["pred_mfu"] for t in doc["top"]] == sorted(
        (t["pred_mfu"] for t in doc["top"]), reverse=True
    )


def test_every_format_says_it_is_predicted(tmp_path):
    best = first_of_the_dry_run()
    out = {}
    for fmt in ("table", "yaml", "torchtitan", "torchtitan-cli", "megatron", "nanotron"):
        r = sweep_cli("best", SPEC, "--plan", "--format", fmt, cwd=tmp_path)
        assert r.returncode == 0, (fmt, r.stderr)
        out[fmt] = r.stdout
    assert "best predicted layouts (the plan's model; no trial measured them)" in out["table"]
    # a comment line in TOML, YAML and flags, read back by each format's parser
    for fmt in ("yaml", "torchtitan", "torchtitan-cli", "megatron", "nanotron"):
        assert out[fmt].startswith("# ") and MARK in out[fmt].splitlines()[0], (fmt, out[fmt][:300])
    toml = tomllib.loads(out["torchtitan"])
    assert toml["parallelism"]["tensor_parallel_degree"] == best["tp"]
    assert toml["parallelism"]["pipeline_parallel_degree"] == best["pp"]
    rec = yaml.safe_load(out["yaml"])
    assert rec["predicted"] is True and rec["tp"] == best["tp"] and rec["mfu"] is None
    assert yaml.safe_load(out["nanotron"])["general"]["run"] == "llama13b_2k-predicted"
    assert f"--tensor-model-parallel-size {best['tp']} " in out["megatron"]


def test_plan_with_nothing_to_run_exits_2_and_with_results_is_refused(tmp_path: Path):
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(global_batch_size=3)
    spec["space"]["micro_batch_size"] = [2]
    path = tmp_path / "zero.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("best", str(path), "--plan", cwd=tmp_path)
    assert r.returncode == 2 and "no candidate layout is left after the plan" in r.stderr
    both = sweep_cli("best", SPEC, "--plan", "--results", str(tmp_path), cwd=tmp_path)
    assert both.returncode == 2 and "--plan" in both.stderr and "--results" in both.stderr

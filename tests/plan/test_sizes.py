"""The pre-run answer over node counts: `sweep best --plan` and `sweep run --dry-run --json` give
the dry run's per-size table and honour `--by` and the goal's limits as `sweep best` does on
measured results (one function, `plan_answers`), each verdict stated against the model's band."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweeper.estimate.cost import run_cost
from sweeper.launchers import plan_for_launcher
from sweeper.plan.plan import make_plan
from sweeper.plan.sizes import SizeAnswer, Winner, plan_answers, verdict, winner
from sweeper.spec.loader import parse_sweep
from sweeper.spec.schema import GoalSpec
from tests.conftest import SPACES, sweep_cli

GOAL = GoalSpec(tokens=1e12, gpu_hour_cost=2.0, max_days=30)


def _predicted(days: float, band: float | None = 0.3, measured: bool = False) -> SizeAnswer:
    tps = GOAL.tokens / (days * 86_400)
    run = run_cost(tps, 64, GOAL)
    return SizeAnswer(8, 64, {}, tps, 0.5, measured=measured, band=band, run=run, misses=run.misses(GOAL))


@pytest.mark.parametrize(
    ("days", "measured", "words"),
    [
        (34.9, False, "misses max_days: 34.9 > 30 unless the model is 17 % pessimistic"),  # 34.9/30 = 1.163
        (45.0, False, "misses max_days: 45.0 > 30 even at the top of its ±30% band"),  # 50 % away
        (25.0, False, "met unless the model is 17 % optimistic"),  # 25/30: 16.7 % of room
        (15.0, False, "met"),  # 50 % of room, beyond the band
        (34.9, True, "misses max_days: 34.9 > 30"),  # a measurement has no band
        (25.0, True, "met"),
    ],
)
def test_verdicts_are_stated_against_the_band(days, measured, words):
    assert verdict(_predicted(days, measured=measured), GOAL) == words


def test_the_cost_limit_is_read_against_the_band_too():
    goal = GoalSpec(tokens=1e12, gpu_hour_cost=2.0, max_cost=1.0e5)
    tps = goal.tokens / (30 * 86_400)
    run = run_cost(tps, 64, goal)  # 46,080 GPU-hours, 92,160: 7.8 % under the limit
    a = SizeAnswer(8, 64, {}, tps, 0.5, measured=False, band=0.3, run=run, misses=run.misses(goal))
    assert verdict(a, goal) == "met unless the model is 8 % optimistic"


def test_the_plan_winner_weighs_predicted_sizes_and_the_measured_one_does_not():
    fast, slow = _predicted(10.0), _predicted(40.0)
    assert winner([fast, slow], Winner.time) is None  # `sweep best` on results: measured sizes only
    assert winner([fast, slow], Winner.time, measured=False) is fast
    assert winner([slow], Winner.cost, measured=False) is None  # misses max_days: no size meets the goal


@pytest.fixture(scope="module")
def sizes_file(tmp_path_factory) -> str:
    spec = yaml.safe_load((SPACES / "llama13b_2k.yaml").read_text())
    spec["cluster"] = {"nodes": [8, 16, 32], "gpus_per_node": 8, "gpu": "h100-sxm"}
    spec["space"] = {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch_size": [1, 2]}
    path = tmp_path_factory.mktemp("sizes") / "sizes.yaml"
    # days at 8 nodes, from the plan itself: a max_days between the 8- and 16-node runs' days
    sweep = parse_sweep(yaml.safe_dump(spec | {"goal": {"tokens": 1e12}}))
    found, _ = plan_answers(plan_for_launcher(make_plan(sweep)))
    days = {a.nodes: a.run.days for a in found if a.run}
    assert days[8] > days[16] > days[32]
    limit = round((days[8] + days[16]) / 2, 1)
    spec["goal"] = {"tokens": 1e12, "gpu_hour_cost": 2.0, "max_days": limit}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def test_plan_honours_by_and_the_goal_like_the_dry_run(sizes_file, tmp_path):
    docs = {}
    for by in ("time", "cost"):
        r = sweep_cli("best", sizes_file, "--plan", "--by", by, "--format", "json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        docs[by] = json.loads(r.stdout)
    dry = sweep_cli("run", sizes_file, "--dry-run", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    per = json.loads(dry.stdout)["per_nodes"]
    # the dry run and --plan give the same per-size answer
    assert per["sizes"] == docs["time"]["per_nodes"]["sizes"] == docs["cost"]["per_nodes"]["sizes"]
    sizes = {s["nodes"]: s for s in per["sizes"]}
    assert sizes[8]["misses"] and sizes[8]["verdict"].startswith("misses max_days")
    assert all(sizes[n]["days"] > 0 and sizes[n]["cost"] > 0 for n in (8, 16, 32))
    # --by time: the fastest (32); --by cost: the cheapest meeting max_days (16), though 8 is cheaper
    assert docs["time"]["nodes"] == 32 and docs["cost"]["nodes"] == 16
    assert per["marks"]["cheapest"] == 8 and per["marks"]["cheapest_in_time"] == 16
    assert per["winner_nodes"] == 32 and per["winner_nodes_by_cost"] == 16
    for by, n in (("time", 32), ("cost", 16)):
        lay = docs[by]["layout"]
        assert lay["num_devices"] == n * 8 and docs[by]["best"]["nodes"] == n
        assert (lay["nodes"], lay["gpus_per_node"]) == (n, 8)  # the layout's own GPUs, said whole
        assert {k: lay[k] for k in ("tp", "pp", "micro_batch_size")} == {
            k: sizes[n]["layout"][k] for k in ("tp", "pp", "micro_batch_size")
        }


def test_plan_exports_are_for_the_size_chosen_by(sizes_file, tmp_path):
    for by, n in (("time", 32), ("cost", 16)):
        r = sweep_cli("best", sizes_file, "--plan", "--by", by, "--format", "megatron", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"chosen for {n} node(s)" in r.stdout.splitlines()[0]
    table = sweep_cli("best", sizes_file, "--plan", "--by", "cost", cwd=tmp_path)
    assert "best predicted layout per node count" in table.stdout
    assert "--by cost: 16 node(s), the cheapest predicted run meeting the goal's limits" in table.stdout


def test_plan_with_no_size_meeting_the_goal_exits_1_naming_each(sizes_file, tmp_path):
    spec = yaml.safe_load(Path(sizes_file).read_text())
    spec["goal"]["max_days"] = 0.01
    path = tmp_path / "never.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("best", str(path), "--plan", "--format", "megatron", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert "no node count is predicted to meet the goal (8 node(s): misses max_days" in r.stderr
    assert "even at the top of its ±30% band" in r.stderr


def test_out_says_what_it_wrote(sizes_file, tmp_path):
    r = sweep_cli("run", sizes_file, "--dry-run", "--json", "--out", str(tmp_path / "plan.parquet"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)  # stdout stays one JSON document
    assert f"wrote: the plan, 36 layouts (one row each), to {tmp_path / 'plan.parquet'}" in r.stderr

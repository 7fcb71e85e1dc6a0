"""`sweep report` of a sweep over several node counts (issue 45): the header names every size, the
winner follows `--by` as `sweep best` names it, each trial's breakdown and prediction is priced at
the node count it ran at, and a panel shows each size's best with its interval, days and cost, the
goal's max_days and max_cost drawn on the days-against-cost plot.

The replay table is the throughput model itself (each layout's predicted step at its own node count,
1 % noise): a trial priced at the right size is predicted within a few %, one priced at the sweep's
first size (8 nodes for a 32-node trial) is off by a factor."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from sweeper.plan.plan import Plan, make_plan
from sweeper.report.data import match_plan_rows, mfu_points
from sweeper.report.explain import explain_top
from sweeper.report.plots import draw_sizes
from sweeper.report.sizes_data import predict_at_sizes, size_points
from sweeper.results.rows import ResultsStore
from sweeper.spec.loader import load_sweep
from tests.conftest import sweep_cli
from tests.sizes_replay import SIZES, write_sizes_sweep

GOAL = {"tokens": 1.0e12, "gpu_hour_cost": 2.0, "max_days": 40, "max_cost": 300000}


def _model_step(plan: Plan, row: int, nodes: int, i: int) -> float:
    return float(plan.throughput.total[row])


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("sizes_report")
    path = write_sizes_sweep(tmp, GOAL, _model_step)
    r = sweep_cli("run", str(path), cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp, path


def _page(tmp: Path, path: Path, *by: str) -> str:
    r = sweep_cli("report", str(path), *by, cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return html.unescape((tmp / "results" / "sizes" / "report.html").read_text())


@pytest.mark.parametrize("by", ["time", "cost"])
def test_the_report_names_every_size_and_the_winner_by(reported, by):
    tmp, path = reported
    best = json.loads(sweep_cli("best", str(path), "--by", by, "-f", "json", cwd=tmp).stdout)
    trial, nodes = best["layout"]["trial_number"], best["layout"]["nodes"]
    page = _page(tmp, path, "--by", by)
    assert "{8, 16, 32}×8 a100-80gb" in page
    assert f"Winner --by {by} at {nodes} node(s): trial {trial} at " in page
    assert f"--by {by}: {nodes} node(s), trial {trial}," in page  # the panel's answer line
    assert f"Top layouts at {nodes} node(s) (--by {by})" in page
    runner = re.search(r"Margin over the runner-up \(trial (\d+),", page)
    frame = ResultsStore(tmp / "results" / "sizes").frame()
    size = dict(zip(frame.trial_number, frame.nodes))
    assert runner is not None and size[int(runner.group(1))] == nodes  # the runner-up of the same size


def test_the_tp_pp_heatmaps_show_the_answers_size_alone(reported):
    from sweeper.report.data import cell_kinds

    tmp, path = reported
    best = json.loads(sweep_cli("best", str(path), "--by", "cost", "-f", "json", cwd=tmp).stdout)
    nodes = best["layout"]["nodes"]
    page = _page(tmp, path, "--by", "cost")
    captions = re.findall(r"MFU by tp × pp — attention [^,\s]+, checkpointing [^,\s<]+(, at \d+ node\(s\))?", page)
    assert captions and set(captions) == {f", at {nodes} node(s)"}
    frame = ResultsStore(tmp / "results" / "sizes").frame()
    ok = frame[(frame.status == "ok") & (frame.nodes == nodes)]
    attn, ckpt = ok.attention.iloc[0], ok.activation_checkpointing.iloc[0]
    plan = make_plan(load_sweep(path))
    cells = cell_kinds(frame, plan, attn, ckpt, nodes)
    here = ok[(ok.attention == attn) & (ok.activation_checkpointing == ckpt)]
    want = here.groupby(["tp", "pp"]).mfu.max()  # the best at the answer's size, not over every size
    got = cells[cells.kind == "ok"].set_index(["tp", "pp"]).mfu
    assert got.sort_index().to_dict() == pytest.approx(want.sort_index().to_dict())
    assert (frame.groupby(["tp", "pp"]).mfu.max().loc[want.index] > want).any()  # another size ran faster there


def test_the_panel_shows_each_sizes_best_interval_days_and_cost(reported):
    tmp, path = reported
    page = _page(tmp, path)
    best = json.loads(sweep_cli("best", str(path), "-f", "json", cwd=tmp).stdout)
    panel = re.search(r"<table class=sizes>(.*?)</table>", page, re.S)
    assert panel is not None
    rows = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", panel.group(1))]
    rows = [r for r in rows if r]
    assert [int(r[0]) for r in rows] == list(SIZES)
    for cells, want in zip(rows, best["per_nodes"]["sizes"]):
        assert cells[2] == f"trial {want['trial_number']}"
        assert re.fullmatch(r"[\d.]+–[\d.]+%", cells[9])  # the trial's MFU interval
        assert cells[10] == f"{want['days']:.1f}" and cells[13] == f"{want['cost']:,.0f}"
        low, high = map(float, cells[11].split("–"))
        assert low < want["days"] < high
    assert "goal: 1e+12 tokens, 2 per GPU-hour, max_days 40, max_cost 300000" in page


def test_each_trial_is_priced_at_the_node_count_it_ran_at(reported):
    tmp, path = reported
    sweep = load_sweep(tmp / "results" / "sizes" / "sweep.yaml")
    plan = make_plan(sweep)
    frame = ResultsStore(tmp / "results" / "sizes").frame()
    assert sorted(frame.nodes.unique()) == list(SIZES)
    # the model, size by size, is the plan's own step of every row
    assert np.allclose(predict_at_sizes(plan.cols, sweep).total, plan.throughput.total, equal_nan=True)
    pts = mfu_points(frame, plan, sweep)
    assert pts.predicted is not None and pts.measured is not None
    assert np.allclose(pts.predicted, pts.measured, rtol=0.03)  # the table is the model: on the diagonal
    ex = explain_top(frame, plan, sweep)
    assert ex is not None
    idx = match_plan_rows(plan, ex.trials)
    assert idx is not None
    assert np.allclose(ex.predicted_s, ex.trials["step_time_mean_s"].to_numpy(float), rtol=0.03)
    assert "the calibrated model misses" not in _page(tmp, path)


def test_the_days_against_cost_plot_draws_the_limits_and_keeps_its_labels(reported):
    tmp, _ = reported
    sweep = load_sweep(tmp / "results" / "sizes" / "sweep.yaml")
    frame = ResultsStore(tmp / "results" / "sizes").frame()
    points = size_points(make_plan(sweep), frame.to_dict("records"))
    assert (points.max_days, points.max_cost) == (40, 300000)
    fig = draw_sizes(points)
    left = fig.axes[0]
    lines = {ln.get_label(): ln for ln in left.get_lines()}
    assert list(lines["max_days 40"].get_ydata()) == [40, 40] and list(lines["max_cost 300000"].get_xdata()) == [
        300000,
        300000,
    ]
    assert left.get_ylim()[0] <= 40 <= left.get_ylim()[1] and left.get_xlim()[0] <= 300000 <= left.get_xlim()[1]
    box = left.get_window_extent()
    for t in left.texts:  # every node count's label inside the axes, none cut at its edge
        b = t.get_window_extent()
        assert box.x0 <= b.x0 and b.x1 <= box.x1 and box.y0 <= b.y0 and b.y1 <= box.y1, t.get_text()
    assert sorted(t.get_text() for t in left.texts) == [f"{n} nodes" for n in sorted(SIZES, key=str)]


def test_fresh_takes_the_sizes_plot_for_the_reports_own(tmp_path):
    """`sweep run --fresh` after `sweep report` of a sweep over sizes: nodes_cost.png is the report's
    file, deleted with the rest, not a stranger's that refuses the start-over."""
    path = write_sizes_sweep(tmp_path, GOAL, _model_step)
    assert sweep_cli("run", str(path), cwd=tmp_path, timeout=300).returncode == 0
    _page(tmp_path, path)
    assert (tmp_path / "results" / "sizes" / "nodes_cost.png").is_file()
    again = sweep_cli("run", str(path), "--fresh", "-y", cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (tmp_path / "results" / "sizes" / "nodes_cost.png").exists()

"""cp, ep and etp where a user looks (one-line summaries, tables of trials, `sweep best` in every
format, `sweep status`), and a mixture of experts' total and active parameters in the dry run."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import yaml

from sweeper.cli.best import Format, best
from sweeper.cli.progress import describe
from sweeper.cli.render import param_counts, print_best
from sweeper.cli.status import status
from sweeper.knobs import KNOBS, shown_in_tables
from sweeper.layouts.layout import Layout
from sweeper.report.data import varying_knobs
from sweeper.results.rows import ResultsStore
from sweeper.spec.models import PRESETS
from sweeper.trainers.export import layout_record
from tests.conftest import make_sweep

WORLD = 64


def result_row(number: int, mfu: float | None, **knobs: Any) -> dict[str, Any]:
    """A results row of a trial on 64 GPUs (etp resolved, as the plan writes it)."""
    lay = Layout(**knobs)
    return {
        "trial_number": number,
        "status": "ok" if mfu is not None else "oom",
        "mfu": mfu,
        **lay.as_dict(),
        "dp": lay.dp(WORLD),
        "grad_accum": lay.grad_accum(WORLD, 512),
        "num_devices": WORLD,
    }


def test_summaries_name_cp_ep_etp_only_where_set():
    assert describe(Layout(tp=2, cp=2, ep=4, etp=1)).endswith("cp=2 ep=4 etp=1")
    dense = describe(Layout(tp=2, sequence_parallel=True))
    assert "cp=" not in dense and "ep=" not in dense  # etp follows tp: nothing to say
    assert "etp" not in describe(Layout(tp=4, ep=8))  # etp = tp = 4
    assert describe({"tp": 2, "pp": 1, "cp": float("nan"), "etp": None}) == "tp=2 pp=1"  # older rows


def test_tables_show_etp_only_where_it_departs_from_tp():
    follows = [{"tp": 1, "etp": 1}, {"tp": 2, "etp": 2}]
    assert not shown_in_tables("etp", follows)
    assert shown_in_tables("etp", [{"tp": 2, "etp": 1}, {"tp": 2, "etp": 2}])
    assert shown_in_tables("cp", [{"cp": 1}, {"cp": 2}]) and not shown_in_tables("cp", [{"cp": 2}, {"cp": None}])
    dense = pd.DataFrame([result_row(0, 0.4, tp=1), result_row(1, 0.5, tp=2)])
    assert varying_knobs(dense) == ["tp", "dp"]
    moe = pd.DataFrame([result_row(0, 0.4, tp=2, ep=4, etp=1), result_row(1, 0.5, tp=2, cp=2, ep=8)])
    assert varying_knobs(moe) == ["cp", "ep", "etp", "dp"]


def test_best_table_has_cp_ep_etp_columns_where_they_vary(capsys):
    rows = [result_row(0, 0.40, tp=2, cp=2, ep=4, etp=1), result_row(1, 0.45, tp=2, ep=8, etp=2)]
    print_best(rows, top=5, title="moe")
    header = next(line for line in capsys.readouterr().out.splitlines() if "MFU" in line)
    cells = [c.strip() for c in header.split("┃") if c.strip()]
    assert [c for c in cells if c in ("cp", "ep", "etp")] == ["cp", "ep", "etp"]
    print_best([result_row(0, 0.4, tp=1), result_row(1, 0.5, tp=2)], top=5, title="dense")
    assert "etp" not in capsys.readouterr().out


def test_dry_run_header_gives_total_and_active_parameters():
    assert param_counts(PRESETS["qwen3-30b-a3b"]) == "30.53B params, 3.35B active per token"
    assert param_counts(PRESETS["llama3-8b"]) == "8.03B params"


def test_layout_record_of_an_moe_and_of_an_old_row():
    sweep = make_sweep(model="qwen3-30b-a3b", space={"tp": [1, 2], "pp": [1]})
    m = sweep.model
    rec = layout_record(result_row(1, 0.5, tp=2, sequence_parallel=True, cp=2, ep=8, etp=1), sweep)
    assert (rec["cp"], rec["ep"], rec["etp"], rec["experts"], rec["experts_per_token"]) == (2, 8, 1, 128, 8)
    assert (rec["params"], rec["active_params"]) == (m.num_params, m.active_params)
    old = {k: v for k, v in result_row(1, 0.5, tp=2).items() if k not in ("cp", "ep", "etp")}
    rec = layout_record(old, make_sweep())  # results written before cp/ep/etp: their defaults, etp = tp
    assert (rec["cp"], rec["ep"], rec["etp"]) == (1, 1, 2) and "experts" not in rec
    assert layout_record(old | {"etp": KNOBS["etp"].default}, make_sweep())["etp"] == 2


def test_best_and_status_show_cp_ep_etp(tmp_path, capsys):
    spec = tmp_path / "moe.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "moe",
                "model": "qwen3-30b-a3b",
                "seq_len": 4096,
                "global_batch_size": 512,
                "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
                # the rows' sequence parallelism among the space's: a row outside it is skipped (issue 48)
                "space": {"tp": [1, 2], "cp": [1, 2], "ep": [4, 8], "etp": [1], "sequence_parallel": [False, True]},
                "workload": {"kind": "megatron", "command": "pretrain_gpt.py {flags}"},
                "results_dir": str(tmp_path / "results"),
            }
        )
    )
    store = ResultsStore(tmp_path / "results" / "moe")
    store.ensure()
    store.write_row(result_row(0, 0.40, tp=2, sequence_parallel=True, ep=4, etp=1))
    store.write_row(result_row(1, 0.45, tp=2, sequence_parallel=True, cp=2, ep=8, etp=1))
    store.write_row(result_row(2, None, tp=1, cp=2, ep=8, etp=1))
    best(str(spec), top=5, fmt=Format.json, results=None)
    doc = json.loads(capsys.readouterr().out)
    assert (doc["best"]["cp"], doc["best"]["ep"], doc["best"]["etp"]) == (2, 8, 1)
    assert doc["layout"]["cp"] == 2 and doc["layout"]["active_params"] < doc["layout"]["params"]
    best(str(spec), top=5, fmt=Format.yaml, results=None)
    assert yaml.safe_load(capsys.readouterr().out)["ep"] == 8
    best(str(spec), top=5, fmt=Format.megatron, results=None)
    out = capsys.readouterr().out
    assert "--context-parallel-size 2" in out and "--expert-model-parallel-size 8" in out
    status(str(spec), as_json=True)
    layouts = [json.loads(line)["layout"] for line in capsys.readouterr().out.splitlines()]
    assert layouts[1].endswith("cp=2 ep=8 etp=1") and layouts[2].endswith("cp=2 ep=8")


def test_dry_run_table_has_the_searched_cp_and_ep_and_the_active_parameters():
    import io

    from rich.console import Console

    from sweeper.cli.render import print_plan
    from sweeper.plan.plan import make_plan

    space = {"tp": [1, 2], "sequence_parallel": [True], "cp": [1, 2], "ep": [1, 8], "etp": [1], "sharding": ["zero1"]}
    sweep = make_sweep(
        model="qwen3-30b-a3b",
        seq_len=4096,
        global_batch_size=512,
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        space=space,
        workload={"kind": "megatron", "command": "pretrain_gpt.py {flags}"},
    )
    out = io.StringIO()
    print_plan(make_plan(sweep), console=Console(file=out, width=200))
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if "pred MFU" in line)
    cells = [c.strip() for c in header.split("┃") if c.strip()]
    assert "cp" in cells and "ep" in cells and "etp" not in cells  # etp = [1]: one value, not shown
    assert any("30.53B params, 3.35B active per token" in line for line in lines)

"""The sweep's Optuna study as optuna-dashboard serves it: failures FAIL with their error, every
trial with its status, layout and job id, the objective named `mfu`. A real replay sweep through
`sweep run`, a real SQLite study, and the dashboard's own WSGI app (no server, no browser)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pandas as pd
import yaml

from tests.conftest import sweep_cli

ROWS = [
    {"tp": 1, "pp": 1, "micro_batch_size": 1, "status": "ok", "mfu": 0.55},
    {"tp": 2, "pp": 1, "micro_batch_size": 1, "status": "ok", "mfu": 0.50},
    {"tp": 1, "pp": 2, "micro_batch_size": 1, "status": "oom", "mfu": None, "error": "CUDA out of memory\nTried..."},
    {
        "tp": 2,
        "pp": 2,
        "micro_batch_size": 1,
        "status": "failed",
        "mfu": None,
        "error": "NCCL error: unhandled system error",
    },
]


def replay_sweep(tmp_path: Path) -> Path:
    """A finished 4-trial sweep answered by the replay launcher from ROWS; returns its results folder."""
    table = tmp_path / "past.csv"
    pd.DataFrame(ROWS).to_csv(table, index=False)
    spec = {
        "name": "dash",
        "model": {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn": 5632, "vocab": 32000},
        "seq_len": 4096,
        "global_batch_size": 512,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1]},
        "search": {"max_trials": 4, "parallel": 1},
        "launcher": {"kind": "replay", "table": str(table)},
        "results_dir": str(tmp_path / "results"),
    }
    path = tmp_path / "dash.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return tmp_path / "results" / "dash"


def get(app: Any, path: str) -> Any:
    """One GET through the dashboard's WSGI app, as its web page would send it."""
    environ: dict[str, Any] = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc=None: status.append(s)))
    assert status[0].startswith("200"), (status, body[:500])
    return json.loads(body)


def test_dashboard_shows_failures_attributes_and_metric_name(tmp_path):
    from optuna_dashboard import wsgi

    results = replay_sweep(tmp_path)
    app = wsgi(f"sqlite:///{results / 'optuna.db'}")
    studies = get(app, "/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == ["dash"]
    detail = get(app, f"/api/studies/{studies[0]['study_id']}")
    assert detail["objective_names"] == ["mfu"]
    trials = {t["number"]: t for t in detail["trials"]}
    attrs = {n: {a["key"]: a["value"] for a in t["user_attrs"]} for n, t in trials.items()}
    assert sorted(a["status"] for a in attrs.values()) == ["failed", "ok", "ok", "oom"]
    by_status = {a["status"]: (trials[n], a) for n, a in attrs.items()}
    ok = [(t, a) for t, a in ((trials[n], attrs[n]) for n in trials) if a["status"] == "ok"]
    assert sorted(t["values"][0] for t, _ in ok) == [0.5, 0.55] and all(t["state"] == "Complete" for t, _ in ok)
    failed, failed_attrs = by_status["failed"]
    assert failed["state"] == "Fail" and not failed.get("values")
    assert failed_attrs["error"] == "NCCL error: unhandled system error"
    assert failed_attrs["layout"].startswith("tp=2 pp=2 micro_batch_size=1 ")
    oom, oom_attrs = by_status["oom"]
    assert oom["state"] == "Fail" and oom_attrs["error"] == "CUDA out of memory"  # the first line only
    assert all(a["job_id"] and a["trial_number"] in {"0", "1", "2", "3"} for a in attrs.values()), attrs
    # the dashboard's best trial is a measured one, never a failure
    assert [t["number"] for t in detail["best_trials"]] == [
        n for n, a in attrs.items() if a["status"] == "ok" and trials[n]["values"][0] == 0.55
    ]

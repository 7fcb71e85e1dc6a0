"""Issue 38: two multi-node torchx trials of one sweep in flight never share node 0's master port
(trials 1000 apart collided on `master_port + trial % 1000`); a finished trial frees its port, and a
re-attached one keeps the port its submit recorded. No scheduler is asked: the port is chosen before."""

from __future__ import annotations

import pytest

from sweeper.launchers.torchx import TorchxLauncher, TorchxProfile
from sweeper.launchers.torchx_trials import PORTS
from tests.conftest import make_sweep

pytest.importorskip("torchx")


def launcher() -> TorchxLauncher:
    profile = TorchxProfile.model_validate({"kind": "torchx", "scheduler": "local_cwd"})
    return TorchxLauncher(profile, make_sweep())


def test_trials_1000_apart_get_different_ports():
    tx = launcher()
    assert PORTS == 1000
    assert tx.port_offset(5) == 5
    assert tx.port_offset(1005) == 6  # 5 is held by trial 5, still in flight
    assert tx.port_offset(6) == 7
    assert tx.port_offset(5) == 5  # a trial keeps its port
    tx._ports.free(5)  # trial 5 ended (TorchxLauncher._ended frees it)
    assert tx.port_offset(2005) == 5


def test_the_port_reaches_the_replicas_command_line(tmp_path):
    from sweeper.launchers.base import TrialJob
    from sweeper.launchers.torchx import app_def
    from sweeper.layouts.layout import Layout

    tx = launcher()
    job = TrialJob(
        number=1001,
        layout=Layout.from_mapping({"tp": 1}),
        workdir=tmp_path,
        spec_path=tmp_path / "sweep.yaml",
        timeout_s=60.0,
    )
    tx.port_offset(1)
    app = app_def(tx.profile, tx.sweep, job, "img", "", port_offset=tx.port_offset(1001))
    args = app.roles[0].args
    assert args[args.index("--master-port") + 1] == str(29500 + 2)

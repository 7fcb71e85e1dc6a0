"""Fixtures shared by the fault tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.faults.test_hardening import ran, replay_spec


@pytest.fixture(scope="session")
def replay_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The results folder of the 4-layout replay sweep `ran` makes, run once by the real CLI for
    the session: many tests start from it and each gets its own copy (`ran_ex`)."""
    base = tmp_path_factory.mktemp("replay-ran")
    ran(base)
    return base / "results"


@pytest.fixture
def ran_ex(tmp_path: Path, replay_results: Path) -> Path:
    """What `ran(tmp_path)` leaves, without running the sweep again: the same spec written under
    tmp_path and a copy of the finished results folder (modes and times kept). Rows and study hold
    no paths (the identity leaves paths out); only the recorded sweep.yaml does, so it is rewritten
    in place, as the run itself would have written it."""
    spec = replay_spec(tmp_path)
    shutil.copytree(replay_results, tmp_path / "results", symlinks=True)
    recorded = tmp_path / "results" / "ex" / "sweep.yaml"
    recorded.write_text(spec.read_text())
    return spec

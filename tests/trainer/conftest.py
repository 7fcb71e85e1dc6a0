"""The trainer tests write torch's scratch files (inductor cache, launch folders) under pytest's tmp dir; the
parity launches that test_parity and test_parity_families share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Inductor's cache and every launch's scratch files go under pytest's tmp dir, cleaned by pytest."""
    path = tmp_path_factory.mktemp("torch-tmp")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = None  # tempfile caches the directory it found first
    yield path
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


# Each launch starts its ranks (torch, gloo, the model) once for all its cases: the 8-rank cases and
# the 2-rank cases (compiled or not) of both parity modules run in one launch each, not one per module.
@pytest.fixture(scope="session")
def eight_ranks_parity(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .test_parity import EIGHT_RANKS, _run
    from .test_parity_families import EIGHT_RANKS as FAMILIES

    assert not EIGHT_RANKS.keys() & FAMILIES.keys()
    return _run(EIGHT_RANKS | FAMILIES, 8, tmp_path_factory.mktemp("parity8"), timeout_s=600)


@pytest.fixture(scope="session")
def two_ranks_parity(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every 2-rank parity case of both modules, the compiled ones included, in one launch."""
    from . import test_parity as p
    from . import test_parity_families as f

    groups = [p.TWO_RANKS, p.COMPILED, f.TWO_RANKS, f.COMPILED]
    cases = {cid: case for group in groups for cid, case in group.items()}
    assert len(cases) == sum(len(g) for g in groups)  # no case id shared, none overwritten
    return p._run(cases, 2, tmp_path_factory.mktemp("parity2"), timeout_s=900)


@pytest.fixture(scope="session")
def cp_ep_parity(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank launch of test_context_parallel and test_moe: one start-up for both."""
    from sweeper.launchers.ranks import launch

    from .helpers import ROOT, tiny_sweep
    from .test_context_parallel import MODEL_CASES, STEPS
    from .test_cp_ep_trainer import TRAINER_CASES, trainer_specs
    from .test_moe import CASES, MODEL_EP2

    ids = [CASES.keys(), MODEL_EP2.keys(), MODEL_CASES.keys(), TRAINER_CASES.keys()]
    assert sum(len(k) for k in ids) == len(set().union(*ids)) and "cp" not in CASES
    cp = {"sweep": tiny_sweep(2), "steps": STEPS, "model_cases": list(MODEL_CASES.values())}
    ep = {"cases": [case | {"id": cid} for cid, case in CASES.items()] + list(MODEL_EP2.values())}
    kwargs = {"cp": cp, "ep": ep, "trainer": trainer_specs()}
    task = {"kind": "call", "target": "tests.trainer.cp_ep_workers:cp_and_ep_parity", "kwargs": kwargs}
    workdir = tmp_path_factory.mktemp("cp_ep2")
    done = launch(task, nprocs=2, timeout_s=600, workdir=workdir, extra_env={"PYTHONPATH": str(ROOT)})
    if done.timed_out or any(done.returncodes):
        pytest.fail("\n".join(done.log_tail(r, 40) for r in range(2)))
    return done.out_dir

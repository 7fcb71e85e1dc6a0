"""The trainer tests write torch's scratch files (launch folders) under pytest's tmp dir (inductor's cache
is the run's own, tests/conftest.py); the parity launches that test_parity, test_parity_families,
test_context_parallel, test_moe and test_cp_ep_trainer share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import KERNELS, run_workers


@pytest.fixture(scope="session", autouse=True)
def private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every launch's scratch files go under pytest's tmp dir, cleaned by pytest."""
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


# Each launch starts its ranks (torch, gloo, the model: ~5 s of CPU a rank) once for all its cases:
# every 2-rank case of the five parity modules runs in one launch, the 4-rank ones in another
# (test_parity's `four_ranks`), the 8-rank ones in a third. Each runs once per kernel setting (helpers.KERNELS, a
# fixture parameter: tests get `[isa-avx2-...]` ids); were there two, their launches would be two xdist groups
# (tests/conftest.py).
@pytest.fixture(scope="session", params=list(KERNELS))
def eight_ranks_parity(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .test_parity import EIGHT_RANKS, _run
    from .test_parity_families import EIGHT_RANKS as FAMILIES

    assert not EIGHT_RANKS.keys() & FAMILIES.keys()
    return _run(EIGHT_RANKS | FAMILIES, 8, tmp_path_factory.mktemp("parity8"), kernels=request.param, timeout_s=600)


@pytest.fixture(scope="session", params=list(KERNELS))
def two_rank_launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every 2-rank case in one launch: the dense layouts of test_parity and test_parity_families
    (the compiled ones included), then test_context_parallel's, test_moe's and test_cp_ep_trainer's."""
    from . import test_parity as p
    from . import test_parity_families as f
    from .helpers import STEPS, tiny_sweep
    from .test_context_parallel import MODEL_CASES
    from .test_cp_ep_trainer import TRAINER_CASES, trainer_specs
    from .test_moe import CASES, MODEL_EP2

    groups = [p.TWO_RANKS, p.COMPILED, f.TWO_RANKS, f.COMPILED]
    cases = {cid: case for group in groups for cid, case in group.items()}
    assert len(cases) == sum(len(g) for g in groups)  # no case id shared, none overwritten
    ids = [cases.keys(), CASES.keys(), MODEL_EP2.keys(), MODEL_CASES.keys(), TRAINER_CASES.keys()]
    assert sum(len(k) for k in ids) == len(set().union(*ids)) and "cp" not in set().union(*ids)
    kwargs = {
        "dense": {"cases": p.specs(cases, 2), "steps": STEPS},
        "cp": {"sweep": tiny_sweep(2), "steps": STEPS, "model_cases": list(MODEL_CASES.values())},
        "ep": {"cases": [case | {"id": cid} for cid, case in CASES.items()] + list(MODEL_EP2.values())},
        "trainer": trainer_specs(),
    }
    workdir = tmp_path_factory.mktemp("parity2")
    done = run_workers(
        "two_rank_parity",
        module="cp_ep_workers",
        nprocs=2,
        workdir=workdir,
        timeout_s=900,
        env=KERNELS[request.param],
        **kwargs,
    )
    return done.out_dir


@pytest.fixture(scope="session")
def two_ranks_parity(two_rank_launch: Path) -> Path:
    """The dense 2-rank cases of test_parity and test_parity_families (in `two_rank_launch`)."""
    return two_rank_launch


@pytest.fixture(scope="session")
def cp_ep_parity(two_rank_launch: Path) -> Path:
    """The cases of test_context_parallel, test_moe and test_cp_ep_trainer (in `two_rank_launch`)."""
    return two_rank_launch

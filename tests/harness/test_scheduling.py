"""The order in which `pytest -n 2 --dist loadgroup` hands out its units of work (tests/conftest.py): the
longest first, by the seconds recorded in tests/durations.json, so that what is left at the end is short."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import conftest


def test_recorded_seconds_outweigh_the_guess_from_marks() -> None:
    known = {"t.py::parsers": 24.0}
    # the parsers' group (many quick tests behind one 24 s harness, none marked slow) against one slow test
    parsers = dict.fromkeys(["t.py::parsers", *(f"t.py::case{i}" for i in range(60))], False)
    slow = {"t.py::sweep": False}
    assert conftest._weight(parsers, set(), known) == pytest.approx(24.0 + 60 * 0.1)
    assert conftest._weight(slow, {"t.py::sweep"}, known) == 20.0
    assert conftest._weight(parsers, set(), known) > conftest._weight(slow, {"t.py::sweep"}, known)
    assert conftest._weight(parsers, set(), {}) < conftest._weight(slow, {"t.py::sweep"}, {})  # guessed: the other way


def test_the_recorded_file_lists_tests_of_this_suite_by_seconds() -> None:
    recorded = json.loads(conftest.DURATIONS.read_text())
    assert recorded and all(isinstance(v, float) and v >= conftest._STORED for v in recorded.values())
    root = Path(conftest.__file__).parents[1]
    files = {nodeid.split("::")[0] for nodeid in recorded}
    assert all((root / f).is_file() for f in files), sorted(f for f in files if not (root / f).is_file())


def test_an_unreadable_file_leaves_every_unit_guessed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "durations.json")
    assert conftest._recorded_durations() == {}
    (tmp_path / "durations.json").write_text("[1, 2]")
    assert conftest._recorded_durations() == {}
    (tmp_path / "durations.json").write_text('{"a.py::t": 3.5}')
    assert conftest._recorded_durations() == {"a.py::t": 3.5}


def test_a_test_that_shares_nothing_is_a_unit_of_its_own(request: pytest.FixtureRequest) -> None:
    # every autouse fixture made once per session (the learned-profile cache, each worker's fork server)
    # is the worker's own: counted as shared, it would group every test with every other in one unit
    assert conftest._shared_fixtures(request.node) == []


@pytest.fixture(scope="module")
def shared_launch() -> str:
    return "made once for the module's tests"


def test_a_test_of_a_shared_launch_is_grouped_by_it(request: pytest.FixtureRequest, shared_launch: str) -> None:
    assert conftest._shared_fixtures(request.node) == ["shared_launch"]

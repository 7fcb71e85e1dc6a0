"""A reference file promised in ../shared/reference/ that is absent fails a CI run and skips
elsewhere (tests.conftest.missing_reference); the ones the tests read are there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import missing_reference
from tests.trainers.test_export_nanotron import ARCHIVE as NANOTRON_ARCHIVE
from tests.trainers.test_export_parsers import MEGATRON_ARCHIVE

ABSENT = Path("/nonexistent/shared/reference/x.tar.gz")


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_an_absent_reference_fails_in_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match=f"{ABSENT} is absent: a reason.*must not skip"):
        missing_reference(ABSENT, "a reason")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_an_absent_reference_skips_outside_ci(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=f"{ABSENT} is absent: a reason"):
        missing_reference(ABSENT, "a reason")


@pytest.mark.parametrize("archive", [NANOTRON_ARCHIVE, MEGATRON_ARCHIVE], ids=["nanotron", "megatron-lm"])
def test_the_promised_archives_are_there(archive: Path) -> None:
    if not archive.is_file():
        missing_reference(archive, "the export tests read it")

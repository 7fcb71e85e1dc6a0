"""A trial the full disk kept from writing its result: the disk's doing, not the layout's.

Such a trial becomes a row whose error starts with NOT_WRITTEN and names the cause and the path;
it is not told to the search (its layout stays untried), does not spend the budget, and is not
retried on the full disk: the sweep stops, and the `sweep run` after space returns runs it again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from sweeper.launchers.base import Handle, JobOutcome, TrialJob, failure, tail
from sweeper.statuses import TrialStatus

NOT_WRITTEN = "result not written"
LOW_SPACE_BYTES = 1 << 20  # less free than this under a trial's folder: the disk is full for a trial
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")


def out_of_space(path: Path, text: str = "") -> str | None:
    """Why a trial under `path` could not write its result, when the disk is the cause: its file
    system nearly full, or a quota hit in `text` (its error and log). None otherwise: "No space
    left on device" alone, with space free here, is another device's (e.g. /dev/shm), the layout's."""
    if _FULL_TEXTS[1] in text:
        return _FULL_TEXTS[1]
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return f"{_FULL_TEXTS[0]} ({free} bytes free)" if free < LOW_SPACE_BYTES else None


def mentions_full_disk(text: str) -> bool:
    return any(t in text for t in _FULL_TEXTS)


def not_written(row: Mapping[str, Any]) -> bool:
    """A row of a trial whose result the full disk kept from being written (see NOT_WRITTEN)."""
    return str(row.get("error") or "").startswith(NOT_WRITTEN)


def unwritten(handle: Handle, outcome: JobOutcome) -> JobOutcome | None:
    """A trial that failed without a result while its folder's disk is full: the outcome as a
    `result not written` row naming the cause and the path, None when the disk is not the cause."""
    if outcome.result.status != TrialStatus.FAILED:
        return None
    text = (outcome.result.error or "") + (tail(Path(outcome.log_path), 20) if outcome.log_path else "")
    why = out_of_space(handle.job.workdir, text)
    if why is None:
        return None
    path = handle.job.workdir / "result.json"
    error = f"{NOT_WRITTEN}: {why} writing {path}; not a verdict on the layout, the next `sweep run` runs it again"
    return replace(outcome, result=failure(TrialStatus.FAILED, error, handle.job), infrastructure_failure=False)


def left_unwritten(job: TrialJob) -> bool:
    """A vanished job that a full disk ended (its log says so, or the trial could not write even
    its first line there): it runs again after its retry too, as the layout never ran to a result."""
    log = job.workdir / "log.txt"
    return mentions_full_disk(tail(log, 40)) or (log.is_file() and log.stat().st_size == 0)

"""`sweep run` SIGKILLed at seeded random moments and restarted: the same trials as an
uninterrupted sweep, no duplicates, no partial file visible to readers, the study consistent."""

from __future__ import annotations

import random

import pytest

from benchmarks.kill_resume import check, demo_spec, run_to_end, run_with_kills
from tests.faults.helpers import assert_no_processes_left, assert_rows_match_study, frame, results

pytestmark = pytest.mark.slow


def test_random_sigkills_lose_nothing_and_duplicate_nothing(tmp_path):
    run_to_end(demo_spec(tmp_path, "clean", steps=3, trials=4))
    reference = frame(tmp_path, "clean")
    seed = random.Random(7).randrange(1 << 16)
    delays = run_with_kills(demo_spec(tmp_path, "killed", steps=3, trials=4), cycles=5, seed=seed, max_delay_s=8.0)
    c = check(results(tmp_path, "killed"), reference)
    assert (c.lost, c.duplicates, c.partial_files) == (0, 0, []), (c, delays, seed)
    assert c.finished == 4 and c.statuses == {"ok": 4}, (c, delays, seed)
    assert_rows_match_study(tmp_path, "killed")
    assert_no_processes_left(results(tmp_path, "killed"))

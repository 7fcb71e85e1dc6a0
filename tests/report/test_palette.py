"""The step-time breakdown's colours: every part of the model its own, far enough from every other
that two parts never read as one block (before, 10 colours cycled over 15 parts: "attention" and
"data-parallel comm (exposed)" were both #8172b2, and an 8B report merged them)."""

from __future__ import annotations

import itertools

from matplotlib.colors import to_rgb

from sweeper.estimate.step_time import HIDDEN_PARTS, PART_LABELS, PARTS
from sweeper.report.plots import PART_COLORS

# the nearest two of the palette are 65 apart (attention and the hidden dp strip); 40 on 0-255 RGB is
# about where neighbouring tones of one hue begin to read as one colour in a small legend patch
MIN_DISTANCE = 40.0


def _distance(a: str, b: str) -> float:
    return sum((255 * (x - y)) ** 2 for x, y in zip(to_rgb(a), to_rgb(b), strict=True)) ** 0.5


def test_every_part_has_a_colour_of_its_own():
    assert set(PART_COLORS) == set(PARTS) == set(PART_LABELS)
    assert len(set(PART_COLORS.values())) == len(PARTS)


def test_no_two_parts_look_alike():
    close = [
        (a, ca, b, cb, round(_distance(ca, cb)))
        for (a, ca), (b, cb) in itertools.combinations(PART_COLORS.items(), 2)
        if _distance(ca, cb) < MIN_DISTANCE
    ]
    assert not close, close


def test_the_hidden_parts_are_drawn_apart_from_their_exposed_ones():
    """dp and cp traffic hidden behind backward: the exposed part's hue, lighter, never the same colour."""
    for hidden, exposed in zip(HIDDEN_PARTS, ("dp_comm", "cp_comm"), strict=True):
        assert PART_COLORS[hidden] != PART_COLORS[exposed]
        assert sum(to_rgb(PART_COLORS[hidden])) > sum(to_rgb(PART_COLORS[exposed]))

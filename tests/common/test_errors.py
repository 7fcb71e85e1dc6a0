"""One-line messages: `one_line` keeps whole sentences and never cuts one in the middle."""

from __future__ import annotations

from sweeper.errors import one_line


def test_short_text_is_kept_whole_on_one_line():
    assert one_line("a  kernel\n failed:\tno backend.") == "a kernel failed: no backend."


def test_long_text_keeps_the_sentences_that_fit():
    text = "No viable backend was found. This is likely due to turning off both kernels. " + "More detail. " * 30
    assert one_line(text, 80) == "No viable backend was found. This is likely due to turning off both kernels."


def test_a_first_sentence_longer_than_the_limit_is_cut_between_words_and_marked():
    text = "word " * 40
    out = one_line(text, 50)
    assert out.endswith(" …") and len(out) <= 52 and out.removesuffix(" …").split() == ["word"] * 10

"""One root for user errors: printed as one line, exit code 2; anything else is a bug."""

from __future__ import annotations


class SweepError(Exception):
    """A problem with what the user gave us (a sweep file, a flag, a path)."""

    exit_code = 2


class SpecError(SweepError):
    """The sweep file is malformed or asks for something impossible."""


class NoSuccessError(SweepError):
    """The sweep has no successful trial: every format of `best`, and `run`, exit 1 so scripts notice."""

    exit_code = 1


class Interrupted(SweepError):
    """Ctrl-C: a sweep stopped before its end exits 130, as a shell reports a command SIGINT ended, so a
    script never takes it for a finished one."""

    exit_code = 130


def one_line(text: object, limit: int = 300) -> str:
    """`text` on one line (whitespace collapsed), at most about `limit` characters: whole sentences
    while they fit, so that a message is never cut mid-sentence; a first sentence longer than that
    is cut between words and marked with an ellipsis."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    head = flat[: limit + 1]
    end = head.rfind(". ")
    if end > 0:
        return flat[: end + 1]
    cut = head.rfind(" ")
    return flat[: cut if cut > 0 else limit].rstrip(" ,;:") + " …"

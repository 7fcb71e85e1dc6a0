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

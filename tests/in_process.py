"""`sweep ARGS` run in the test's own process: the same `sweeper.cli.main` a console script calls, with
the command's own working folder, environment, argument list and standard streams, put back after.

Why: the suite ran some 470 short `sweep` commands, each a new Python that imported typer, pydantic,
pandas and pyarrow before any work (1.3-1.8 s of CPU each: a third of the suite's CPU, by process
accounting). The commands that only read a results folder or a sweep file and print (`best`, `status`,
`compare`, `report`, a dry run) run here instead; what sweeps, forks or signals (a real `run`, `trial`,
`profile`) still runs as a process of its own, as do the tests that check the process itself.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

# subcommands that read and print, and write nothing but the files they are asked to (an export, a page)
_READ_ONLY = frozenset({"best", "status", "compare", "report"})


def runs_here(args: Sequence[str]) -> bool:
    """Whether `sweep ARGS` is a command that reads and prints (a dry run included). `SWEEP_TEST_CLI_PROCESS=1`
    runs every command as a process again (to compare, or to check that nothing here leaks between tests)."""
    if os.environ.get("SWEEP_TEST_CLI_PROCESS", "") not in ("", "0"):
        return False
    command = next((a for a in args if not a.startswith("-")), None)
    return command in _READ_ONLY or (command == "run" and "--dry-run" in args)


def run_here(
    args: Sequence[str], *, cwd: Path, env: Mapping[str, str], input: str | None, merge_stderr: bool
) -> subprocess.CompletedProcess[str]:
    """`sweep ARGS` run to its end here, its outcome as `subprocess.run` would give it: the exit code
    (an uncaught exception's traceback on stderr and code 1, as Python ends a process), the text of
    stdout and stderr (one text with `merge_stderr`), read from pipes that are no terminal."""
    from sweeper.cli import main

    out = _pipe()
    err = out if merge_stderr else _pipe()
    code = 0
    with _as_a_process(args, cwd, env, input, out, err):
        try:
            main()
        except SystemExit as e:
            code = _exit_code(e, err)
        except BaseException:  # what a process would die of: its traceback, as the interpreter prints it
            traceback.print_exc(file=err)
            code = 1
    return subprocess.CompletedProcess(["sweep", *args], code, _text(out), None if merge_stderr else _text(err))


@contextlib.contextmanager
def _as_a_process(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    input: str | None,
    out: io.TextIOWrapper,
    err: io.TextIOWrapper,
) -> Iterator[None]:
    """The working folder, environment, argv and streams of a process of its own, and Python's
    warnings shown on its stderr (pytest's would collect them instead); all put back after."""
    saved = (os.getcwd(), dict(os.environ), sys.argv, sys.stdin, sys.stdout, sys.stderr)
    try:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["sweep", *args]
        sys.stdin = io.StringIO(input or "")
        sys.stdout, sys.stderr = out, err
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.simplefilter("default")
            warnings.showwarning = _show_on_stderr
            yield
    finally:
        out.flush()
        err.flush()
        cwd_before, env_before, sys.argv, sys.stdin, sys.stdout, sys.stderr = saved
        os.environ.clear()
        os.environ.update(env_before)
        os.chdir(cwd_before)


def _show_on_stderr(message, category, filename, lineno, file=None, line=None) -> None:  # type: ignore[no-untyped-def]
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _exit_code(e: SystemExit, err: io.TextIOWrapper) -> int:
    """The status `sys.exit(X)` leaves, as the interpreter makes it: None is 0, an int is itself, anything
    else is printed on stderr and is 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=err)
    return 1


def _pipe() -> io.TextIOWrapper:
    """A text stream over bytes, as a pipe is to a process: UTF-8, no terminal, with a `buffer` of its own."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", errors="replace")

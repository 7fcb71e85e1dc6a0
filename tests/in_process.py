"""`sweep ARGS` run in the test's own process: the same `sweeper.cli.main` a console script calls, with
the command's own working folder, environment, argument list and standard streams, put back after.

Why: the suite ran some 470 short `sweep` commands, each a new Python that imported typer, pydantic,
pandas and pyarrow before any work (1.3-1.8 s of CPU each: a third of the suite's CPU, by process
accounting). `best`, `status`, `compare`, `report` and `run` (a dry run, a replayed sweep, or a sweep whose trials
are processes of their own, as every launcher starts them) run here instead: a replayed `sweep run` of 4
trials took 5 s of CPU as a process, 4 of them importing scikit-learn, scipy and Optuna's storage, which
a test's process imports once. `trial` and `profile` (ranks and measurements in the process itself) still
run as processes of their own, as does every command a test starts to signal or kill (`start_cli`).
A command run here has no `timeout` of its own: one that hangs is ended by pytest-timeout's limit on its
test (`timeout` in pyproject.toml), where the process would have been killed at the caller's `timeout`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

# subcommands whose own process does no work of a trial: they read, print, plan and start processes
_HERE = frozenset({"best", "status", "compare", "report", "run"})


def runs_here(args: Sequence[str]) -> bool:
    """Whether `sweep ARGS` runs in the test's process. `SWEEP_TEST_CLI_PROCESS=1` runs every command as a
    process again (to compare, or to check that nothing here leaks between tests)."""
    if os.environ.get("SWEEP_TEST_CLI_PROCESS", "") not in ("", "0"):
        return False
    return next((a for a in args if not a.startswith("-")), None) in _HERE


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
    """The working folder, environment, argv, umask and streams of a process of its own, Python's
    warnings shown on its stderr (pytest's would collect them instead), and the log handlers that write
    to stderr writing to its stderr (Optuna's is made once, on the stderr of its day); all put back after."""
    saved = (os.getcwd(), dict(os.environ), sys.argv, sys.stdin, sys.stdout, sys.stderr)
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = _stderr_handlers()
    try:
        for handler in handlers:
            handler.setStream(err)
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
        os.umask(umask)  # `sweep run` makes its own 077
        for handler in {*handlers, *_stderr_handlers(out, err)}:  # and any it made on the command's stderr
            handler.setStream(sys.stderr)


def _stderr_handlers(*streams: object) -> list[logging.StreamHandler]:
    """The log handlers of every logger that write to `streams` (default: this process's stderr)."""
    streams = streams or (sys.stderr, sys.__stderr__)
    loggers = [
        logging.getLogger(),
        *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ]
    return [
        h
        for lg in loggers
        for h in lg.handlers
        if type(h) is logging.StreamHandler and any(h.stream is s for s in streams)
    ]


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

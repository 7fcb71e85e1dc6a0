"""Ctrl-C outside the run loop's own handler (at `--fresh`'s question, while planning, or the second
one): `sweep run` quits at once with one line and exit 130, as a shell reports a command SIGINT ended,
never click's "Aborted!" and exit 1 that a script would take for a refused sweep; nothing deleted."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import cli_command, cli_env


def _wait_for(proc: subprocess.Popen[bytes], text: bytes, timeout: float = 120) -> bytes:
    """What the process wrote to stderr until `text` (a question ends without a newline)."""
    assert proc.stderr is not None
    seen, deadline = b"", time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stderr], [], [], 0.2)[0]:
            seen += os.read(proc.stderr.fileno(), 4096)
    assert text in seen, seen[-2000:]
    return seen


def test_ctrl_c_at_the_fresh_question_quits_with_130_and_deletes_nothing(ran_ex: Path, tmp_path: Path):
    trials = sorted((tmp_path / "results" / "ex" / "trials").iterdir())
    proc = subprocess.Popen(
        cli_command("run", str(ran_ex), "--fresh"),
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.PIPE,  # kept open: the question waits for an answer
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen = _wait_for(proc, b"delete every result of ex")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = (seen + err).decode()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "Aborted" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted: quit at once"), err
    assert sorted((tmp_path / "results" / "ex" / "trials").iterdir()) == trials  # nothing deleted

"""Entry point of one rank started by `launch`: `python -m sweeper.runtime.worker WORKDIR`.

WORKDIR/task.pkl says what to run: a trial (`{"kind": "trial", "sweep", "layout"}`) or any
function (`{"kind": "call", "target": "module:function", "kwargs"}`, called with `out_dir`),
which is how the tests run several layouts in one launch. Outputs go to WORKDIR/out.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from pathlib import Path


def main(workdir: Path) -> int:
    with open(workdir / "task.pkl", "rb") as f:
        task = pickle.load(f)  # written by our own launcher, for this run only
    out_dir = workdir / "out"
    if task["kind"] == "trial":
        from sweeper.runtime.runner import run_trial

        run_trial(task["sweep"], task["layout"], out_dir=out_dir)
        return 0
    module, name = task["target"].split(":")
    getattr(importlib.import_module(module), name)(out_dir=out_dir, **task.get("kwargs", {}))
    return 0


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter shutdown: torch's distributed teardown at exit aborts now and then
    # ("terminate called without an active exception"); the process group is already gone.
    os._exit(code)

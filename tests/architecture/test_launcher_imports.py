"""The launchers sit above the trainer and the pure core: no arrow from a lower module up.

Read from the source (every import that runs, in functions too), so a lazy import cannot hide
a cycle that only shows once a trial runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sweeper"
# the layers above the launchers: they start sweeps, trials and profiles, and may use any launcher (the
# sweep loop, `orchestrator`, with the parts it delegates: `slow_trials`, `unwritten`)
ABOVE = ("cli", "run", "launchers")  # the sweep loop, `sweep profile` and `sweep selftest` are in run/


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_nothing_below_the_launchers_imports_them():
    below = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ABOVE]
    assert any(p.parent.name == "runtime" for p in below)  # the built-in trainer's runtime is among those checked
    upward = {
        str(p.relative_to(PACKAGE)): sorted(m for m in imports(p) if m.startswith("sweeper.launchers")) for p in below
    }
    assert not {k: v for k, v in upward.items() if v}


def test_only_the_slurm_launcher_imports_submitit():
    users = sorted(
        p.name for p in (PACKAGE / "launchers").glob("*.py") if any(m.split(".")[0] == "submitit" for m in imports(p))
    )
    assert users == ["slurm.py"]


def test_only_the_torchx_launcher_imports_torchx_and_the_schedulers_clients():
    clients = ("torchx", "ray", "docker", "kubernetes")
    users = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(m.split(".")[0] in clients for m in imports(p))
    )
    assert users == ["launchers/torchx.py"]


def test_the_launcher_registry_loads_no_torchx():
    # every sweep (and every dry run) imports every launcher module: torchx only where a torchx trial runs
    import subprocess
    import sys

    code = (
        "import sys; from sweeper.launchers import launcher_classes; launcher_classes(); print('torchx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"

"""The sweep file's package: its public names where they always were, and no import cycle with the layout rules.

The loader checks a sweep against the layout rules (`sweeper.layouts.layout.unusable`), so the layout
module, and everything the schema is built from (the trainers, the memory model, the exports),
must not import the spec at run time: each must import first in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sweeper.spec

ROOT = Path(__file__).resolve().parents[1]
BELOW_THE_LOADER = (
    "sweeper.layouts.layout",
    "sweeper.trainers",
    "sweeper.estimate.memory",
    "sweeper.layouts.stages",
    "sweeper.trainers.export",
)


def test_public_names_are_reexported():
    for name in (
        "Sweep",
        "SweepFile",
        "parse_sweep",
        "load_sweep",
        "find_sweep_file",
        "build_sweep",
        "format_validation_error",
        "shipped_spaces_dir",
        "SpaceSpec",
        "MemorySettings",
        "StateBytes",
        "WorkloadSpec",
        "TrialSettings",
        "SearchSettings",
        "ClusterSpec",
        "GPUSpec",
        "ModelSpec",
    ):
        assert hasattr(sweeper.spec, name), name
    assert set(sweeper.spec.__all__) <= set(dir(sweeper.spec))
    assert sweeper.spec.shipped_spaces_dir().is_dir()


def _runtime_imports(path: Path) -> set[str]:
    """Modules a file imports when it runs (not under `if TYPE_CHECKING:`)."""
    out: set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for c in child.orelse:
                    walk(c)
                continue
            if isinstance(child, ast.ImportFrom) and child.module:
                out.add(child.module)
            elif isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            walk(child)

    walk(ast.parse(path.read_text()))
    return out


@pytest.mark.parametrize("module", BELOW_THE_LOADER)
def test_modules_below_the_loader_import_no_spec(module: str):
    base = ROOT / Path(*module.split("."))
    files = sorted(base.glob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    for f in files:
        spec_imports = {m for m in _runtime_imports(f) if m == "sweeper.spec" or m.startswith("sweeper.spec.")}
        assert not spec_imports, f"{f.relative_to(ROOT)} imports {spec_imports} at run time"


def test_each_imports_first_in_a_fresh_interpreter():
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    # the layout rules and the trainers: the two the schema and the loader import first
    for module in ("sweeper.layouts.layout", "sweeper.trainers"):
        r = subprocess.run(
            [sys.executable, "-c", code, module, "sweeper.spec"], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert r.returncode == 0, (module, r.stderr[-1000:])

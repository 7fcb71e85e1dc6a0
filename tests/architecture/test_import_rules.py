"""The house's plan, held: no import cycle (imports for type checking and inside functions included),
every module imports only what its folder's `May import:` line allows, the pure core imports no
torch, Optuna or submitit, and every package imports first in a fresh interpreter."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "sweeper"
FOUNDATION = ("errors", "files", "process", "packages", "knobs", "statuses", "text")
# the pure core of the design: layouts, memory, FLOPs, the throughput model, the search
PURE = ("spec", "profiles", "layouts", "estimate", "trainers", "plan", "search")
HEAVY = ("torch", "optuna", "submitit")
ALLOWED_HEAVY = {"search": {"optuna"}}  # the search's study is an Optuna study


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in PKG.rglob("*.py")}


def imports(name: str, path: Path) -> set[str]:
    """Every module `path` imports, wherever the import stands (functions, `if TYPE_CHECKING:`)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {
        n: {d for d in imports(n, p) if d in mods and d != n and not n.startswith(d + ".")} for n, p in mods.items()
    }


def folder(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "sweeper"
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def allowed() -> dict[str, tuple[set[str], dict[str, set[str]]]]:
    """Each folder's `May import:` line, and the modules its docstring lets import more."""
    out = {"foundation": ({"foundation"}, {})}
    for init in sorted(PKG.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        line = re.search(r"^May import: (.+?)\.?$", doc, re.M)
        assert line, f"{init.relative_to(ROOT)}: its docstring has no 'May import:' line"
        names = {"*"} if line.group(1).strip() == "every folder" else {s.strip() for s in line.group(1).split(",")}
        extra = {}
        for more in re.finditer(r"^.*\(([\w, ]+)\) may also import: (.+?)\.?$", doc, re.M):
            for m in more.group(1).split(","):
                extra[m.strip()] = {s.strip() for s in more.group(2).split(",")}
        out[init.parent.name] = (names | {init.parent.name}, extra)
    return out


def test_no_import_cycle():
    g, seen, stack = graph(), set(), []

    def visit(n: str) -> list[str] | None:
        if n in stack:
            return [*stack[stack.index(n) :], n]
        if n in seen:
            return None
        seen.add(n)
        stack.append(n)
        for d in sorted(g[n]):
            if cycle := visit(d):
                return cycle
        stack.pop()
        return None

    for n in sorted(g):
        assert (cycle := visit(n)) is None, " -> ".join(cycle)


def test_every_module_imports_only_what_its_folder_may():
    rules, broken = allowed(), []
    for name, deps in sorted(graph().items()):
        home = folder(name)
        if home == "sweeper":
            continue
        names, extra = rules[home]
        may = names | extra.get(name.split(".")[-1], set())
        for d in deps:
            if folder(d) not in may and "*" not in may and folder(d) != "sweeper":
                broken.append(f"{name} imports {d} ({folder(d)} is not on {home}'s 'May import:' line)")
    assert not broken, "\n".join(broken)


def test_the_folders_form_a_chain_of_layers():
    """No two folders may import each other: the `May import:` lines draw a partial order."""
    rules = allowed()
    for a, (names, _) in rules.items():
        for b in names - {a, "*"}:
            assert a not in rules.get(b, (set(), {}))[0], f"{a} and {b} may import each other"


@pytest.mark.parametrize("pkg", PURE)
def test_the_pure_core_imports_no_torch_optuna_or_submitit(pkg: str):
    for name, path in modules().items():
        if folder(name) == pkg:
            heavy = {i.split(".")[0] for i in imports(name, path)} & (set(HEAVY) - ALLOWED_HEAVY.get(pkg, set()))
            assert not heavy, f"{name} imports {heavy}"


def test_every_module_imports_first_in_a_fresh_interpreter():
    """A module low in the house must import without a package above it having run first.

    Each module is imported first in a process of its own that has imported no module of sweeper:
    a child forked from one interpreter that loaded only what the low modules import from outside
    sweeper (numpy, pandas, pydantic, scipy's parts...), exactly as named in their imports. An
    interpreter started per module paid those imports 54 times (~30 s); what is checked, the order
    in which sweeper's own modules run, is the same."""
    names = sorted(n for n in modules() if not n.endswith("__main__") and folder(n) not in ("runtime",))
    low = [
        n for n in names if folder(n) in ("foundation", "profiles", "spec", "layouts", "estimate", "trainers", "plan")
    ]
    mods = modules()
    outside = sorted({i for n in low for i in imports(n, mods[n]) if i.split(".")[0] != "sweeper"})
    code = (
        "import importlib, os, sys, traceback\n"
        "outside, low = sys.argv[1].split(','), sys.argv[2:]\n"
        "for m in outside:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError:\n"
        "        pass  # a name imported from a module (`from x import name`), not a module\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'sweeper']\n"
        "bad = []\n"
        "for m in low:\n"
        "    r, w = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.close(r)\n"
        "        try:\n"
        "            importlib.import_module(m)\n"
        "            os._exit(0)\n"
        "        except BaseException:\n"
        "            os.write(w, traceback.format_exc().strip().splitlines()[-1].encode())\n"
        "            os._exit(1)\n"
        "    os.close(w)\n"
        "    with os.fdopen(r, 'rb') as f:\n"
        "        why = f.read().decode()\n"
        "    if os.waitpid(pid, 0)[1]:\n"
        "        bad.append(m + ': ' + why)\n"
        "print('\\n'.join(bad)); sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, ",".join(outside), *low], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_sweeper_has_at_most_twenty_modules_and_packages_at_its_top():
    top = [
        p.name for p in PKG.iterdir() if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    ]
    assert len(top) <= 20, sorted(top)


def test_the_trainers_registry_agrees_with_what_the_sweep_file_declares():
    from sweeper.trainers import declarations_disagree

    assert declarations_disagree() == []

"""Every YAML example of README.md and docs/ read exactly as printed: a fenced block that is a
whole sweep file is parsed as one; a fragment (a `goal:` line, a `launcher:` or `workload:`
mapping) replaces those fields of a small valid sweep. Each must validate, with its numbers numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sweeper.launchers.profiles import resolve_profile
from sweeper.spec.loader import parse_sweep, read_yaml
from tests.conftest import ROOT, base_spec

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```ya?ml\n(.*?)^```", re.M | re.S)


def yaml_blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, m in enumerate(_FENCE.finditer(page.read_text())):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}", m.group(1)))
    return out


BLOCKS = yaml_blocks()


def test_the_pages_have_yaml_examples():
    # the README's sweep file and its goal line, cost.md's goal, launchers.md's and trainers.md's
    assert len(BLOCKS) >= 5, [name for name, _ in BLOCKS]


@pytest.mark.parametrize(("name", "text"), BLOCKS, ids=[n for n, _ in BLOCKS])
def test_a_yaml_example_runs_as_printed(name: str, text: str, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(ROOT)  # `launcher: slurm` names the repository's launchers/slurm.yaml
    data = read_yaml(text, name)
    assert isinstance(data, dict), name
    if "name" in data:
        sweep = parse_sweep(text, source=name)
    else:
        merged = base_spec(**data)
        if "workload" in data:  # an external trainer: its sweep's space keeps to what it can run
            merged["space"] = {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1]}
        sweep = parse_sweep(yaml.safe_dump(merged, sort_keys=False), source=name)
    resolve_profile(sweep)
    if "goal" in data:
        goal = data["goal"]
        assert all(isinstance(v, (int, float)) for v in goal.values()), goal
        assert sweep.goal is not None and sweep.goal.tokens == goal["tokens"]

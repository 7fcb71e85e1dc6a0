"""Numbers as people write them (`2e12`, `2.0e12`, `1_000_000`, `2.0e+12`) read as numbers by the
one YAML loader of sweep files, launcher profiles, measured and learned profiles
(`sweeper.files.parse_yaml`); PyYAML alone reads the first two as strings (YAML 1.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.files import parse_yaml
from sweeper.launchers.profiles import resolve_profile
from sweeper.profiles.profile import ProfileError, read_header
from sweeper.spec.loader import parse_sweep
from tests.conftest import base_spec


@pytest.mark.parametrize(
    ("written", "value"),
    [
        ("2e12", 2e12),
        ("2.0e12", 2e12),
        ("2.0e+12", 2e12),
        ("2E12", 2e12),
        ("-1.5e-3", -1.5e-3),
        (".5e3", 500.0),
        ("1_000_000", 1_000_000),
        ("1_000e3", 1e6),
        ("2.5", 2.5),
        ("7", 7),
    ],
)
def test_numbers_as_written(written, value):
    got = parse_yaml(f"x: {written}", "t")["x"]
    assert got == value and isinstance(got, (int, float)) and not isinstance(got, bool), (written, got)


@pytest.mark.parametrize("text", ["e12", "2e", "1.2.3e4", "2e12x", "v2e12", "1e3.5"])
def test_what_is_not_a_number_stays_a_string(text):
    assert parse_yaml(f"x: {text}", "t")["x"] == text


def _sweep_text(goal: str) -> str:
    spec = base_spec(cluster={"nodes": [8, 16], "gpus_per_node": 8, "gpu": "h100-sxm"})
    return yaml.safe_dump(spec, sort_keys=False) + f"goal: {goal}\n"


@pytest.mark.parametrize("tokens", ["2e12", "2.0e12", "2.0e+12", "2_000_000_000_000"])
def test_the_goal_reads_every_spelling_of_a_number(tokens):
    sweep = parse_sweep(_sweep_text(f"{{tokens: {tokens}, gpu_hour_cost: 2.0, max_days: 60, max_cost: 1.0e6}}"))
    assert sweep.goal is not None
    assert sweep.goal.tokens == 2e12 and sweep.goal.max_cost == 1e6


def test_launcher_profile_reads_numbers_and_refuses_duplicates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "site.yaml").write_text("kind: slurm\nmem_gb: 1.2e3\n")
    sweep = parse_sweep(yaml.safe_dump(base_spec(launcher="site")))
    assert resolve_profile(sweep).mem_gb == 1200.0
    (tmp_path / "launchers" / "site.yaml").write_text("kind: slurm\nkind: local\n")
    with pytest.raises(SpecError, match=r"launcher profile .*site.yaml: invalid YAML at line 2.*duplicate key 'kind'"):
        resolve_profile(sweep)


def test_profile_header_reads_exponent_numbers(tmp_path: Path):
    p = tmp_path / "p.profile.yaml"
    p.write_text("schema: 1\nkind: measured\ngpu: h100-sxm\npeak: 9.89e14\n")
    assert read_header(p)["peak"] == 9.89e14
    p.write_text("schema: 1\nschema: 1\n")
    with pytest.raises(ProfileError, match=r"p.profile.yaml: invalid YAML at line 2.*duplicate key 'schema'"):
        read_header(p)

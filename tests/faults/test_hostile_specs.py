"""Malformed and hostile sweep files: SpecError (exit 2 from the CLI), never another exception,
nothing submitted, no results folder, and nothing from a launcher field reaches a shell."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweeper.errors import SpecError
from sweeper.launchers.profiles import resolve_profile
from sweeper.spec.loader import parse_sweep
from tests.conftest import SPACES, sweep_cli

BASE = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
FIELDS = [
    "name",
    "model",
    "seq_len",
    "global_batch_size",
    "cluster",
    "space",
    "trial",
    "search",
    "launcher",
    "memory",
    "results_dir",
]
SHELL = ["; touch /tmp/pwned", "$(touch /tmp/pwned)", "`id`", "a b", "x|y", "x&&y", "x\ny", "'q'", '"q"', "a>b", "*"]

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
huge = st.integers(min_value=10**7, max_value=10**40) | st.sampled_from([float("inf"), -1, 0, 1e308])


def accepts_or_spec_error(text: str | bytes) -> None:
    """The library's contract on any input: a Sweep, or a SpecError; nothing else escapes."""
    try:
        sweep = parse_sweep(text)
    except SpecError as e:
        message = str(e).strip()
        assert message and "\n" not in message, message  # one line, never empty
        return
    try:
        resolve_profile(sweep)
    except SpecError:
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=junk)
def test_wrong_types_in_any_field(field, value):
    spec = copy.deepcopy(BASE)
    spec[field] = value
    accepts_or_spec_error(yaml.safe_dump(spec))


@settings(max_examples=40, deadline=None)
@given(
    path=st.sampled_from(
        [
            ("seq_len",),
            ("global_batch_size",),
            ("cluster", "nodes"),
            ("cluster", "gpus_per_node"),
            ("model", "layers"),
            ("model", "hidden"),
            ("model", "vocab"),
            ("trial", "steps"),
            ("trial", "timeout_min"),
            ("search", "max_trials"),
            ("search", "parallel"),
        ]
    ),
    value=huge,
)
def test_huge_and_out_of_range_numbers(path, value):
    spec = copy.deepcopy(BASE)
    spec[path[0]] = dict(spec[path[0]]) if len(path) > 1 else spec[path[0]]
    if len(path) > 1:
        spec[path[0]][path[1]] = value
    else:
        spec[path[0]] = value
    accepts_or_spec_error(yaml.safe_dump(spec))


@settings(max_examples=30, deadline=None)
@given(knob=st.text(min_size=1, max_size=12).filter(lambda k: k not in BASE["space"]), values=junk)
def test_unknown_knobs_and_fields(knob, values):
    spec = copy.deepcopy(BASE)
    spec["space"] = {**spec["space"], knob: values}
    with pytest.raises(SpecError):
        parse_sweep(yaml.safe_dump(spec))
    with pytest.raises(SpecError):
        parse_sweep(yaml.safe_dump({**BASE, f"x_{knob}": 1}))


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_and_non_utf8(data):
    accepts_or_spec_error(data)
    accepts_or_spec_error(b"name: \xff\xfe\n" + data)


@settings(max_examples=60, deadline=None)
@given(
    field=st.sampled_from(["partition", "account", "qos", "constraint"]),
    bad=st.sampled_from(SHELL)
    | st.text(min_size=1, max_size=30).filter(lambda s: any(c in s for c in " ;|&$`'\"<>()\n*\\!")),
)
def test_shell_metacharacters_in_sbatch_fields_are_refused(field, bad):
    for launcher in (
        {"kind": "slurm", field: bad},
        {"kind": "slurm", "sbatch_extra": {"gres": bad}},
        {"kind": "slurm", "srun_args": [bad]},
        {"kind": "slurm", "sbatch_extra": {bad: "1"}},
    ):
        sweep = parse_sweep(yaml.safe_dump({**BASE, "launcher": launcher}))
        with pytest.raises(SpecError):
            resolve_profile(sweep)


def test_yaml_alias_bomb_is_refused_quickly():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    with pytest.raises(SpecError, match="alias"):
        parse_sweep(bomb)


HOSTILE_FILES = {
    "wrong_type": yaml.safe_dump({**BASE, "seq_len": "long"}),
    "huge": yaml.safe_dump({**BASE, "cluster": {"nodes": 10**30, "gpus_per_node": 2, "gpu": "cpu"}}),
    "unknown_knob": yaml.safe_dump({**BASE, "space": {**BASE["space"], "warp_drive": [1]}}),
    "alias_bomb": "x: &x [1, 1]\ny: [*x, *x]\n" + yaml.safe_dump(BASE),
    "not_utf8": b"name: caf\xe9\n" + yaml.safe_dump(BASE).encode(),
    "sbatch_injection": yaml.safe_dump({**BASE, "launcher": {"kind": "slurm", "partition": "debug; touch {canary}"}}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_cli_exits_2_creates_nothing_and_runs_nothing(tmp_path: Path, case: str):
    canary = tmp_path / "canary"
    body = HOSTILE_FILES[case]
    body = body.replace("{canary}", str(canary)) if isinstance(body, str) else body
    body = body.encode() if isinstance(body, str) else body
    body = body.replace(b"results_dir: results", b"") + f"\nresults_dir: {tmp_path / 'results'}\n".encode()
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(body)
    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error:") and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "results").exists() and not canary.exists()

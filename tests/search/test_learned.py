"""The learned profile file: where it lives, what it holds, how sweeps' lessons combine into a prior,
what `show` prints and `forget` removes, and the one-line refusal of a malformed file."""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from sweeper.cli.profile import profile_app
from sweeper.errors import SpecError
from sweeper.estimate.step_time import Calibration
from sweeper.profiles.cache import cache_dir
from sweeper.results.identity import sweep_identity
from sweeper.search.learned import (
    MAX_LEARNED_BYTES,
    MAX_SWEEPS,
    LearnedKey,
    Lessons,
    MemoryLesson,
    learned_dir,
    load,
    read,
    save,
)
from sweeper.search.learned_show import describe, forget
from sweeper.search.prior import LearnedEffect
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec, make_sweep, sweep_cli

KEY = LearnedKey("8xa100-80gb", "a100-80gb", "builtin")


def lessons(name: str, sweep_id: str, *, date: str = "2025-01-01T00:00:00+00:00", **over) -> Lessons:
    values = dict(
        sweep_id=sweep_id,
        name=name,
        model="llama-13b",
        nodes=8,
        date=date,
        trials=12,
        measured=10,
        calibration=Calibration(1.2, 0.8, 10),
        effects={("pp", 4): LearnedEffect(math.log(4.0), 3), ("sequence_parallel", True): LearnedEffect(-0.1, 5)},
        memory=MemoryLesson(0.9, 1.5, 1.07, 4),
    )
    return Lessons(**(values | over))


def test_each_test_has_a_cache_of_its_own(tmp_path_factory):
    cache = Path(os.environ["XDG_CACHE_HOME"])
    assert cache.is_relative_to(tmp_path_factory.getbasetemp())  # a folder of this test's, never the user's
    assert cache_dir() == cache / "sweep" / "profiles" and not learned_dir().exists()


def test_a_sweeps_lessons_round_trip_through_the_file():
    path = save(KEY, lessons("a13b", "aaaa"))
    assert path == learned_dir() / "8xa100-80gb__a100-80gb__builtin.yaml"
    data = yaml.safe_load(path.read_text())
    assert (data["schema"], data["kind"], data["cluster"], data["gpu"], data["trainer"]) == (
        1,
        "learned",
        "8xa100-80gb",
        "a100-80gb",
        "builtin",
    )
    assert data["sweeps"][0]["effects"][0] == {"knob": "pp", "value": 4, "log_ratio": 1.3863, "trials": 3}
    back = load(KEY)
    assert back is not None and back.key == KEY
    (s,) = back.sweeps
    assert s.effects[("pp", 4)] == LearnedEffect(1.3863, 3)
    assert s.effects[("sequence_parallel", True)] == LearnedEffect(-0.1, 5)
    assert s.calibration == Calibration(1.2, 0.8, 10) and s.memory == MemoryLesson(0.9, 1.5, 1.07, 4)


def test_the_prior_combines_the_sweeps_but_the_one_asking():
    save(KEY, lessons("a", "aaaa", date="2025-01-01T00:00:00+00:00"))
    save(
        KEY,
        lessons(
            "b",
            "bbbb",
            date="2025-02-01T00:00:00+00:00",
            calibration=Calibration(0.6, 0.8, 30),
            effects={("pp", 4): LearnedEffect(0.0, 1)},
            memory=MemoryLesson(1.1, 0.5, None, 1),
        ),
    )
    save(KEY, lessons("a", "aaaa", date="2025-03-01T00:00:00+00:00", trials=14))  # a resumed: replaces its entry
    profile = load(KEY)
    assert profile is not None and [(s.name, s.trials) for s in profile.sweeps] == [("b", 12), ("a", 14)]
    prior = profile.prior()
    assert prior is not None and prior.sources == ("b", "a")
    assert prior.calibration is not None
    assert prior.calibration.compute_scale == pytest.approx(math.exp((10 * math.log(1.2) + 30 * math.log(0.6)) / 40))
    assert prior.calibration_trials == 40 and prior.calibration_weight == 2.0
    assert prior.effects[("pp", 4)].log_ratio == pytest.approx(3 * 1.3863 / 4) and prior.effects[("pp", 4)].trials == 4
    assert prior.memory is not None and prior.memory.act_scale == pytest.approx((4 * 0.9 + 1.1) / 5)
    assert prior.memory.offset_bytes == pytest.approx((4 * 1.5 + 0.5) / 5 * 2**30)
    assert prior.memory.reserved_factor == pytest.approx(1.07) and prior.memory.points == 0
    alone = profile.prior(exclude="aaaa")  # sweep a, resumed, starts from b's lessons only
    assert alone is not None and alone.sources == ("b",) and alone.effects[("pp", 4)].log_ratio == 0.0
    assert load(KEY).prior(exclude="aaaa") is not None  # type: ignore[union-attr]
    assert profile.prior(exclude="nothing-else") is not None
    only = LearnedKey("other", "a100-80gb", "builtin")
    save(only, lessons("c", "cccc"))
    assert load(only).prior(exclude="cccc") is None  # type: ignore[union-attr]


def test_show_prints_every_number_with_its_sweep():
    path = save(KEY, lessons("a13b", "aaaa"))
    lines = describe(path)
    text = "\n".join(lines)
    assert lines[0].startswith(
        f"learned profile {path} (schema 1): cluster 8xa100-80gb, GPU a100-80gb, trainer builtin"
    )
    assert "sweep a13b (2025-01-01 00:00 UTC, 8 node(s), host not recorded): model llama-13b, id aaaa" in text
    assert "step time = 1.200 x the model's compute + 0.800 x its communication, fitted to 10 measured" in text
    assert "pp=4: 4.00x the model's step time (slower than predicted) from 3 measured layout(s) (from a13b)" in text
    assert "sequence_parallel=true: 0.90x the model's step time (faster than predicted)" in text
    assert "memory: activations x0.900 the estimate's, +1.50 GiB fixed, reserved 1.070x allocated" in text
    assert "a next sweep here starts from (combined over a13b):" in text
    assert "pp=4: 4.00x the model's step time (slower than predicted), counted as 2 layout(s)" in text
    result = CliRunner().invoke(profile_app, ["show", str(path)])
    assert result.exit_code == 0 and result.output.splitlines() == lines
    listed = CliRunner().invoke(profile_app, ["show"])
    assert listed.exit_code == 0 and listed.output.splitlines() == [lines[0]]  # its path once: the line names it


def test_forget_removes_one_key_or_all():
    other = LearnedKey("gpu-partition", "h100-sxm", "megatron")
    a, b = save(KEY, lessons("a", "aaaa")), save(other, lessons("b", "bbbb"))
    assert forget(KEY) == ([a], []) and not a.exists() and b.exists()
    assert forget(KEY) == ([], [])
    save(KEY, lessons("a", "aaaa"))
    assert forget(None) == (sorted([a, b]), []) and not list(learned_dir().glob("*.yaml"))


def test_forget_keeps_a_link_in_the_learned_folder_and_its_target(tmp_path):
    target = save(KEY, lessons("a", "aaaa")).rename(tmp_path / "elsewhere.yaml")
    link = KEY.path
    link.symlink_to(target)  # not a file the tool wrote: named, kept, for the user to remove
    removed, kept = forget(KEY)
    assert removed == [] and link.is_symlink() and target.is_file()
    assert kept == [
        f"kept {link}: {link}: not a regular file (a link or a folder); `forget` deletes cached profiles only"
    ]


def test_forget_learned_names_a_profile_by_its_file_its_name_or_a_sweep_file(tmp_path):
    runner = CliRunner()
    path = save(KEY, lessons("a", "aaaa"))
    result = runner.invoke(profile_app, ["forget", "--learned", path.stem])
    assert result.exit_code == 0 and result.output == f"deleted {path}\n" and not path.exists()
    save(KEY, lessons("a", "aaaa"))
    assert runner.invoke(profile_app, ["forget", "--learned", str(path)]).output == f"deleted {path}\n"
    save(KEY, lessons("a", "aaaa"))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(base_spec()))  # 8 x A100-80GB, the built-in trainer: KEY
    assert runner.invoke(profile_app, ["forget", "--learned", str(spec)]).output == f"deleted {path}\n"
    assert runner.invoke(profile_app, ["forget", "--learned"]).output == "no learned profile to delete\n"
    with pytest.raises(SpecError, match="neither a learned profile"):
        runner.invoke(profile_app, ["forget", "--learned", "no-such"], catch_exceptions=False)


@pytest.mark.parametrize(
    "edit,field",
    [
        ({"schema": 2}, "schema: Input should be 1"),
        ({"kind": "measured"}, "kind: Input should be 'learned'"),
        ({"gpu": None}, "gpu: "),
        ({"sweeps": [{"id": "x"}]}, "sweeps.0.name: Field required"),
        ({"colour": "red"}, "colour: unknown field"),
    ],
)
def test_a_malformed_profile_is_refused_in_one_line_naming_the_field(edit, field):
    path = save(KEY, lessons("a", "aaaa"))
    data = yaml.safe_load(path.read_text()) | edit
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as e:
        load(KEY)
    assert str(e.value).startswith(f"{path}: {field}") and "\n" not in str(e.value)


def test_a_profile_under_another_keys_name_is_refused():
    path = save(KEY, lessons("a", "aaaa"))
    other = LearnedKey("elsewhere", "a100-80gb", "builtin")
    other.path.write_text(path.read_text())
    with pytest.raises(SpecError, match="holds the learned profile of cluster 8xa100-80gb"):
        load(other)
    with pytest.raises(SpecError, match="not a learned profile"):
        KEY.path.write_text("- a list\n")
        read(KEY.path)


def test_the_key_is_the_partition_or_the_node_s_make():
    sweep = make_sweep()
    assert LearnedKey.of(sweep) == KEY
    assert LearnedKey.of(sweep, "booster").cluster == "booster"
    odd = LearnedKey("a/b c", "x:y", "builtin")
    assert odd.slug == "a-b-c__x-y__builtin"


def test_the_dry_run_says_which_learned_profile_it_uses(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(base_spec(results_dir=str(tmp_path / "results"))))
    save(KEY, lessons("a13b", "aaaa"))
    off = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path)
    assert "learned profile: not used (off by default: on recorded sweeps it did not shorten the search" in off.stdout
    KEY.path.unlink()
    on = {"learned_profile": True}
    spec.write_text(yaml.safe_dump(base_spec(results_dir=str(tmp_path / "results"), search=on)))
    env_run = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path)
    assert env_run.returncode == 0, env_run.stderr
    line = [ln for ln in env_run.stdout.splitlines() if ln.startswith("learned profile:")]
    assert line == [
        f"learned profile: none yet for cluster 8xa100-80gb, GPU a100-80gb, trainer builtin; "
        f"this sweep's trials will start {KEY.path}"
    ]
    own = save(KEY, lessons("t", sweep_identity(load_sweep(spec))))  # what this sweep itself kept
    alone = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path).stdout
    assert f"learned profile: {own} holds only this sweep's own lessons; not used, kept for the next sweep" in alone
    save(KEY, lessons("a13b", "aaaa"))
    used = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path).stdout
    assert (
        f"learned profile: {KEY.path}, from 1 earlier sweep(s): a13b (2025-01-01 00:00 UTC, 8 node(s), host not "
        "recorded); used as the prior" in " ".join(used.split())
    )
    spec.write_text(yaml.safe_dump(base_spec(search={"learned_profile": False})))
    assert (
        "learned profile: not used (search.learned_profile: false)"
        in sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path).stdout
    )
    spec.write_text(yaml.safe_dump(base_spec(search={"learned_profile": "yes"})))
    bad = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path)
    assert bad.returncode == 2 and "search.learned_profile" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_sweeps_learned_from_are_named_with_when_and_where_they_ran():
    save(KEY, lessons("a13b", "aaaa", host="gpu-login-1", results="/home/me/results/a13b"))
    (s,) = load(KEY).sweeps  # type: ignore[union-attr]
    assert (s.host, s.results) == ("gpu-login-1", "/home/me/results/a13b")
    origin = "a13b (2025-01-01 00:00 UTC, 8 node(s), on gpu-login-1, results /home/me/results/a13b)"
    assert s.origin == origin and load(KEY).prior().origins == (origin,)  # type: ignore[union-attr]
    assert f"sweep {origin}: model llama-13b" in "\n".join(describe(KEY.path))


def poisoned(path: Path, **effect: object) -> None:
    """A learned profile whose one sweep's pp=4 effect (or other number) is `effect`."""
    save(KEY, lessons("elsewhere", "eeee"))
    data = yaml.safe_load(path.read_text())
    data["sweeps"][0]["effects"][0] |= effect
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("log_ratio", [1.0e300, -3.0, math.log(10.5)])
def test_an_implausible_learned_effect_is_refused_and_said_never_used(log_ratio):
    poisoned(KEY.path, log_ratio=log_ratio)
    profile = load(KEY)
    assert profile is not None
    (s,) = profile.sweeps
    assert ("pp", 4) not in s.effects and ("sequence_parallel", True) in s.effects  # the rest stands
    assert s.calibration is not None and len(s.refused) == 1 and "implausible" in s.refused[0]
    prior = profile.prior()
    assert prior is not None and ("pp", 4) not in prior.effects and prior.refused == s.refused
    text = "\n".join(describe(KEY.path))  # no OverflowError: the ratio of 1e300 is not computed
    assert "refused: elsewhere: pp=4" in text and "not used" in text


def test_a_learned_effect_within_10x_is_used():
    poisoned(KEY.path, log_ratio=math.log(9.5))
    prior = load(KEY).prior()  # type: ignore[union-attr]
    assert prior is not None and prior.effects[("pp", 4)].log_ratio == pytest.approx(math.log(9.5), abs=1e-4)
    assert prior.refused == ()


def test_implausible_scales_and_memory_are_refused_and_said():
    save(
        KEY,
        lessons("odd", "oooo", calibration=Calibration(40.0, 0.8, 10), memory=MemoryLesson(1e6, 1e6, None, 2)),
    )
    (s,) = load(KEY).sweeps  # type: ignore[union-attr]
    assert s.calibration is None and s.memory is None and ("pp", 4) in s.effects
    assert [r.split(" is ")[0] for r in s.refused] == [
        "odd: compute_scale 40",
        "odd: memory act_scale 1e+06",
        "odd: memory offset_gib 1e+06",
    ]


def test_lessons_of_nearer_node_counts_count_more_and_disagreeing_ones_cancel():
    save(KEY, lessons("near", "nnnn", nodes=8, effects={("pp", 4): LearnedEffect(0.4, 2)}))
    save(KEY, lessons("far", "ffff", nodes=64, effects={("pp", 4): LearnedEffect(-0.4, 2)}))
    prior = load(KEY).prior(nodes=8)  # type: ignore[union-attr]
    assert prior is not None
    # weights 2 and 2/8: the mean 0.4 * (2 - 0.25) / 2.25, times their agreement (2 - 0.25) / 2.25
    assert prior.effects[("pp", 4)].log_ratio == pytest.approx(0.4 * (1.75 / 2.25) ** 2, abs=1e-6)
    even = load(KEY).prior()  # type: ignore[union-attr]
    assert even is not None and even.effects[("pp", 4)].log_ratio == pytest.approx(0.0)


def test_a_poisoned_learned_profile_is_said_by_the_dry_run_and_show_has_no_traceback(tmp_path):
    """The hostile file of ../shared/checks/hostile-files: log_ratio 1e300 on one knob value."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(base_spec(results_dir=str(tmp_path / "results"), search={"learned_profile": True})))
    poisoned(KEY.path, log_ratio=1.0e300)
    out = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr
    text = " ".join(out.stdout.split())
    assert "refused: elsewhere: pp=4 exp(1e+300)x the model's step time (slower than predicted): implausible" in text
    shown = CliRunner().invoke(profile_app, ["show", str(KEY.path)])
    assert shown.exit_code == 0 and "refused: elsewhere: pp=4" in shown.output


def test_the_dry_run_names_the_learned_effects_that_move_the_first_choice(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(base_spec(results_dir=str(tmp_path / "results"), search={"learned_profile": True})))
    sweep = load_sweep(spec)
    from sweeper.plan.plan import make_plan
    from sweeper.search.learned_show import moved_first_choice

    plan = make_plan(sweep)
    rows = np.flatnonzero(plan.candidate_mask)
    first = rows[np.argmax(plan.pred_mfu[rows])]
    knob = next(k for k in ("pp", "tp", "micro_batch_size") if len(set(plan.cols[k][rows].tolist())) > 1)
    value = plan.cols[knob][first].item()
    save(KEY, lessons("a13b", "aaaa", calibration=None, effects={(knob, value): LearnedEffect(math.log(1.4), 6)}))
    lines = moved_first_choice(plan, load(KEY).prior())  # type: ignore[arg-type, union-attr]
    assert lines[0].startswith("learned profile: the first trial is ") and "not the model's first choice" in lines[0]
    assert lines[1] == f"  it makes {knob}={value} 1.40x slower than the model says, from 1 sweep(s)"
    out = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path).stdout
    assert f"it makes {knob}={value} 1.40x slower than the model says, from 1 sweep(s)" in out


@pytest.mark.parametrize(
    ("date", "words"),
    [
        ("9999-12-30T00:00:00+00:00", "is in the future"),
        ("zzz", "is not an ISO 8601 time"),
        ("2025-06-01T12:00:00", "has no time zone"),
    ],
)
def test_a_learned_date_that_could_pin_its_entry_is_refused_in_one_line(date, words):
    """Issue 48: a date was a free string sorted as text: `9999-12-30` or `zzz` kept its entry for ever."""
    path = save(KEY, lessons("a", "aaaa"))
    data = yaml.safe_load(path.read_text())
    data["sweeps"][0]["date"] = date
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as info:
        read(path)
    assert f"{path}: sweeps.0.date: {date!r} {words}" in str(info.value) and "\n" not in str(info.value)


def test_a_sweeps_own_lessons_are_kept_whatever_the_others_dates():
    soon = (datetime.now(UTC) + timedelta(hours=12)).isoformat()  # within the clock's skew
    for i in range(MAX_SWEEPS):
        save(KEY, lessons(f"s{i}", f"id{i}", date=soon))
    now = datetime.now(UTC).isoformat()
    save(KEY, lessons("mine", "mine", date=now))
    kept = [s.sweep_id for s in read(KEY.path).sweeps]
    assert len(kept) == MAX_SWEEPS and "mine" in kept, kept


def test_a_learned_file_over_its_limit_is_refused_before_it_is_parsed():
    path = save(KEY, lessons("a", "aaaa"))
    path.write_text(path.read_text() + "#" * MAX_LEARNED_BYTES)
    start = time.monotonic()
    with pytest.raises(SpecError, match=f"at most {MAX_LEARNED_BYTES}"):
        read(path)
    assert time.monotonic() - start < 1.0

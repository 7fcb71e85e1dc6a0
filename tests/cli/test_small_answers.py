"""Smaller answers a newcomer met (issue 37): a preset name one character off is suggested,
`profile forget --gpu` reads GPU aliases as a sweep file does, `profile show` names each file
once, and the report does not call the default `auto` search a grid."""

from __future__ import annotations

import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.profiles.cache import cached_profile_path
from sweeper.profiles.profile import save_profile
from sweeper.spec.loader import parse_sweep
from tests.conftest import base_spec, cli_env, sweep_cli
from tests.profiles.test_profile import synthetic_profile


def test_a_preset_spelled_as_its_release_is_suggested():
    with pytest.raises(SpecError, match=r"unknown model preset 'llama-3.1-8b' \(did you mean 'llama3.1-8b'\?\)"):
        parse_sweep(yaml.safe_dump(base_spec(model="llama-3.1-8b")))
    with pytest.raises(SpecError) as e:
        parse_sweep(yaml.safe_dump(base_spec(model="bert-base")))
    assert "did you mean" not in str(e.value)  # nothing close: no guess


def test_forget_gpu_reads_the_alias_and_show_names_each_file_once(tmp_path):
    env = cli_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    path = cached_profile_path("h100-sxm", env)
    save_profile(synthetic_profile(gpu="h100-sxm"), path)
    shown = sweep_cli("profile", "show", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count(str(path)) == 1, shown.stdout
    r = sweep_cli("profile", "forget", "--gpu", "h100", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert f"deleted {path}" in r.stdout and not path.exists()


def test_sweep_trial_shows_the_95_interval_and_no_expert_knobs_for_a_dense_model(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one line per row
    from sweeper.cli.trial import print_result
    from sweeper.results.trial import TrialResult

    layout = {"tp": 2, "pp": 1, "dp": 1, "micro_batch_size": 1, "grad_accum": 4, "etp": 2, "ep": 1}
    times = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0, 1.0]
    r = TrialResult.from_dict(
        {
            "status": "ok",
            "step_times_s": times,
            "step_time_mean_s": 1.0,
            "step_time_std_s": 0.05,
            "steps_measured": 9,
            "step_time_ci_s": 0.038,
            **layout,
        }
    )
    print_result(r, moe=False)
    out = capsys.readouterr().out
    assert "1.0000 s ± 0.0380 (95 % interval of the mean of 9 measured steps)" in out
    assert "etp=" not in out and "ep=" not in out and "tp=2" in out
    print_result(r, moe=True)
    assert "etp=2" in capsys.readouterr().out


def test_the_live_display_does_not_count_a_trial_stopped_early_as_a_failure():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from sweeper.cli.progress import LiveProgress

    console = Console(file=io.StringIO(), width=200)
    live = LiveProgress(console)
    rows = [
        {"status": "ok", "mfu": 0.4, "tp": 1, "pp": 1, "micro_batch_size": 1, "dp": 1, "grad_accum": 1},
        {"status": "stopped_early", "mfu": None},
        {"status": "oom", "mfu": None},
    ]
    console.print(live._render(SimpleNamespace(rows=rows, running={})))  # the display's rows (a stand-in run)
    text = console.file.getvalue()
    failures = text.split("failures", 1)[1].splitlines()[0]
    assert "oom 1" in failures and "stopped_early" not in failures
    assert "stopped early" in text and "not failures" in text


def test_compare_from_another_folder_points_to_results_a(tmp_path):
    r = sweep_cli("compare", "tiny_cpu", "tiny_cpu", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: no results under results/tiny_cpu (results_dir is relative to this folder, {tmp_path}): "
        "run `sweep run tiny_cpu` first, or give the results folder with --results-a DIR"
    )


def test_help_texts_point_to_sections_that_exist():
    import re

    from tests.conftest import ROOT

    def headings(page: str) -> set[str]:
        text = (ROOT / page).read_text()
        return {h.replace("`", "").strip() for h in re.findall(r"^#+ (.*)$", text, re.M)}

    pointers = []
    for source in (ROOT / "sweeper" / "cli").glob("*.py"):
        text = source.read_text()
        pointers += [(f"docs/{m[0]}.md", m[1]) for m in re.findall(r"docs/(\w+)\.md, '([^']+)'", text)]
        pointers += [("README.md", m) for m in re.findall(r"README '([^']+)'", text)]
    assert ("docs/profiles.md", "sweep profile: measure the node") in pointers
    for page, section in pointers:
        assert section in headings(page), (page, section)
    quick = sweep_cli("profile", "--help", cwd=ROOT, env=cli_env(COLUMNS="300"))
    assert "about a minute on a CPU node" in quick.stdout and "seconds, not minutes" not in quick.stdout


def test_the_docs_say_what_the_exports_do_on_fsdp_and_cuda_graphs():
    from sweeper.trainers.export import layout_record, megatron_args, torchtitan_cli_args
    from tests.conftest import ROOT, make_sweep

    sweep = make_sweep()
    row = {"tp": 2, "pp": 2, "micro_batch_size": 1, "sharding": "fsdp", "dp": 16, "grad_accum": 128}
    args, _ = megatron_args(layout_record(row, sweep))
    flags = "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor"
    assert flags in " ".join(args)
    docs = " ".join((ROOT / "docs" / p).read_text() for p in ("memory.md", "exports.md")).replace("\n", " ")
    assert docs.count(flags.replace(" fsdp_dtensor", "")) >= 2 and "not confirmed" not in docs
    titan, _ = torchtitan_cli_args(layout_record(row | {"sharding": "zero1"}, sweep))
    assert "--training.disable_cuda_graphs" in titan  # pp = 2, ep = 1: for pp too, not only ep
    assert "with pp > 1 or ep > 1 only with `--training.disable_cuda_graphs`" in docs


def test_a_tie_within_noise_is_not_the_heatmaps_two_extremes_and_points_carry_their_interval():
    import pandas as pd

    from sweeper.report.data import colour_scale, interval_ends

    df = pd.DataFrame(
        {
            "status": ["ok", "ok", "oom"],
            "mfu": [0.450, 0.452, None],
            "mfu_low": [0.440, 0.442, None],
            "mfu_high": [0.460, None, None],  # the second's interval reaches 0 s at the top: no upper end
        }
    )
    lo, hi = colour_scale(df)
    assert (lo, hi) == pytest.approx((44.0, 46.0))
    assert 0.2 < (45.0 - lo) / (hi - lo) < 0.8 and 0.2 < (45.2 - lo) / (hi - lo) < 0.8  # both mid-scale
    low, high = interval_ends(df[df.status == "ok"])
    assert list(low) == [0.440, 0.442] and list(high) == [0.460, 0.452]

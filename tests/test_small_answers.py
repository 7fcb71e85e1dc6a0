"""Smaller answers a newcomer met (issue 37): a preset name one character off is suggested,
`profile forget --gpu` reads GPU aliases as a sweep file does, `profile show` names each file
once, and the report does not call the default `auto` search a grid."""

from __future__ import annotations

import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.profiles.profile import cached_profile_path, save_profile
from sweeper.spec.loader import parse_sweep
from tests.conftest import base_spec, cli_env, sweep_cli
from tests.test_profile import synthetic_profile


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

"""Issue 48: text from elsewhere (a trial's error, a config.json field, a profile's device name) is
data, never markup, code or a terminal command. Each medium's function is fed one hostile string
(newlines, quotes, brackets, rich markup, terminal escapes, shell syntax, HTML); each output the
CLI writes is fed it too, through the real `sweep` command."""

from __future__ import annotations

import html
import io
import json
import shlex
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console

from sweeper.errors import SpecError
from sweeper.spec.loader import load_sweep
from sweeper.text import for_comment, for_markup, for_terminal, html_text, shell_word, toml_string, yaml_text
from tests.conftest import SPACES
from tests.faults.helpers import sweep
from tests.spec.test_hf_config import LLAMA31_8B

# a real gloo error (torch names gloo's files in brackets), markup, a hyperlink, a line clear,
# a carriage return, quotes, backslashes, shell and HTML
GLOO = "rank 0: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
EVIL = (
    GLOO + ' [bold red]x[/bold red] [link=http://a.example]y[/link] \\[/] \n[job]\ndump_folder = "PWNED"\n# '
    "\x1b[2K\x1b]8;;http://b.example\x07z\x1b]8;;\x07\r\x9b31m 'q' \"qq\" \\n $(id) `id` <b>&amp;</b>\u2028end"
)


def _rendered(markup: str) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=1000, highlight=False).print(
        markup, soft_wrap=True
    )
    return out.getvalue()


def test_each_medium_keeps_the_text_as_data():
    assert "\x1b" not in for_terminal(EVIL) and "\r" not in for_terminal(EVIL) and "\x9b" not in for_terminal(EVIL)
    assert "\\x1b[2K" in for_terminal(EVIL) and "\n" in for_terminal(EVIL)  # shown, and lines kept
    comment = for_comment(EVIL)
    assert "\n" not in comment and "\u2028" not in comment and "\\n[job]\\ndump_folder" in comment
    # rich prints the text as it is: every bracket, no style, no hyperlink, no control code
    shown = _rendered(for_markup(GLOO + " [bold red]x[/bold red] [link=http://a.example]y[/link]"))
    assert shown.strip() == GLOO + " [bold red]x[/bold red] [link=http://a.example]y[/link]"
    assert "\x1b" not in _rendered(for_markup(EVIL))
    assert tomllib.loads(f"k = {toml_string(EVIL)}\n") == {"k": EVIL}
    assert shlex.split(shell_word(EVIL)) == [EVIL]
    assert yaml.safe_load(yaml_text({"k": EVIL})) == {"k": EVIL}
    assert "<b>" not in html_text(EVIL) and html.unescape(html_text(EVIL)) == EVIL


def test_a_gloo_error_with_markup_is_shown_as_text_by_the_live_display(tmp_path: Path):
    table = tmp_path / "errs.csv"
    rows = [
        {
            "micro_batch_size": 1,
            "status": "failed",
            "error": GLOO + " [bold red]x[/bold red] [link=http://a.example]y[/link]",
        },
        {"micro_batch_size": 2, "status": "ok", "step_times_s": json.dumps([0.2] * 10)},
    ]
    pd.DataFrame(rows).to_csv(table, index=False)
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name="errs", results_dir=str(tmp_path / "results"), launcher={"kind": "replay", "table": str(table)})
    spec["space"].update(tp=[1], pp=[1], micro_batch_size=[1, 2], activation_checkpointing=["none"])
    spec["search"] = {"max_trials": 2, "parallel": 1, "seed": 0}
    path = tmp_path / "errs.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = sweep("run", str(path), cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    flat = " ".join(r.stderr.split())
    # the error's first 100 characters as the trial gave them, brackets and all
    assert "rank 0: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534]" in flat, flat
    assert "\x1b]8;" not in r.stderr


# a Llama 3 shaped model small enough for the demo sweep's CPUs
SMALL_LLAMA = LLAMA31_8B | {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "max_position_embeddings": 1024,
}


def _hf_spec(tmp_path: Path, scaling: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(SMALL_LLAMA | {"rope_scaling": scaling}))
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name="hf", model={"hf_config": "config.json"}, results_dir=str(tmp_path / "results"))
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


INJECTED = 'llama3\n[job]\ndump_folder = "PWNED"\n--save /tmp/x\n#'


@pytest.mark.parametrize("fmt", ["torchtitan", "torchtitan-cli", "megatron", "nanotron", "yaml"])
def test_a_config_json_string_writes_no_live_line_into_an_export(tmp_path: Path, fmt: str):
    spec = _hf_spec(tmp_path, {"rope_type": INJECTED, "factor": 8.0, "original_max_position_embeddings": 8192})
    r = sweep("best", str(spec), "--plan", "--format", fmt, cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    out = r.stdout
    # every line the string could have started is still inside a comment or a quoted value
    for line in out.splitlines():
        assert not line.startswith(("[job]", "dump_folder", "--save", "#\n")), (fmt, line)
    if fmt == "torchtitan":
        assert "job" not in tomllib.loads(out)
    if fmt in ("nanotron", "yaml"):
        text = json.dumps(yaml.safe_load(out))
        assert "PWNED" not in text or json.dumps(INJECTED)[1:-1] in text  # only as the field's own value
    if fmt in ("torchtitan-cli", "megatron"):
        words = shlex.split(out, comments=True)
        assert "--save" not in words and "[job]" not in words, words


def test_a_rope_scaling_number_given_as_text_is_refused_in_one_line(tmp_path: Path):
    for key, value in (("factor", "8\n--save /tmp/x"), ("original_max_position_embeddings", {"a": 1})):
        spec = _hf_spec(tmp_path, {"rope_type": "llama3", "factor": 8.0, key: value})
        with pytest.raises(SpecError, match=rf"rope_scaling\.{key} must be a number, got (str|dict)"):
            load_sweep(spec)
        r = sweep("best", str(spec), "--plan", "--format", "megatron", cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "--save" not in r.stdout, r.stderr
        assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


# ---- forget deletes only its own files -------------------------------------------------------------
def _learned_file(folder: Path, name: str) -> Path:
    """A learned profile as the tool writes it (`learned.save`), moved into `folder`."""
    from sweeper.search.learned import LearnedKey, save
    from tests.search.test_learned import lessons

    folder.mkdir(parents=True, exist_ok=True)
    return save(LearnedKey("c", "cpu", "builtin"), lessons("a", "aaaa")).rename(folder / name)


def test_forget_learned_deletes_nothing_through_a_linked_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "cache"
    team = tmp_path / "team"
    team.mkdir()
    (team / "train.yaml").write_text("a: 1\n")
    theirs = _learned_file(team, "2xcpu__cpu__builtin.yaml")
    (cache / "sweep" / "profiles").mkdir(parents=True)
    (cache / "sweep" / "profiles" / "learned").symlink_to(team)
    r = sweep("profile", "forget", "--learned", cwd=tmp_path, env=_env(cache))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (team / "train.yaml").is_file() and theirs.is_file(), r.stdout
    assert "a link, not the cache's own folder; `forget` deletes nothing through it" in r.stderr
    # and the refusal to read through it names no `chmod` (which would change the link's target)
    from sweeper.files import FileRefused
    from sweeper.profiles.cache import check_cached

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with pytest.raises(FileRefused) as info:
        check_cached(cache / "sweep" / "profiles" / "learned" / "2xcpu__cpu__builtin.yaml")
    assert "a link (to" in str(info.value) and "chmod" not in str(info.value), info.value


def test_forget_learned_keeps_what_is_not_a_learned_profile_of_the_user(tmp_path: Path):
    import os

    cache = tmp_path / "cache"
    folder = cache / "sweep" / "profiles" / "learned"
    mine = _learned_file(folder, "a__cpu__builtin.yaml")
    notes = folder / "notes.yaml"
    notes.write_text("a: 1\n")
    others = _learned_file(folder, "b__cpu__builtin.yaml")
    if os.geteuid() == 0:
        os.chown(others, 4242, 4242)
    r = sweep("profile", "forget", "--learned", cwd=tmp_path, env=_env(cache))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.splitlines() == [f"deleted {mine}"] + ([] if os.geteuid() == 0 else [f"deleted {others}"])
    assert notes.is_file() and f"kept {notes}:" in r.stderr and "not a learned profile" in r.stderr, r.stderr
    if os.geteuid() == 0:
        assert others.is_file() and f"{others}: owned by user 4242, not you; nothing deleted" in r.stderr


def test_forget_a_measured_profile_deletes_nothing_through_a_linked_folder(tmp_path: Path):
    from sweeper.profiles.cache import cached_profile_path

    cache = tmp_path / "cache"
    team = tmp_path / "team"
    team.mkdir()
    (cache / "sweep").mkdir(parents=True)
    (cache / "sweep" / "profiles").symlink_to(team)
    env = _env(cache)
    target = cached_profile_path("cpu", env)
    (team / target.name).write_text("schema: 1\nkind: measured\n")
    for args in (("profile", "forget"), ("profile", "forget", "--gpu", "cpu"), ("profile", "forget", str(target))):
        r = sweep(*args, cwd=tmp_path, env=env)
        assert "Traceback" not in r.stderr and (team / target.name).is_file(), (args, r.stdout, r.stderr)


def _env(cache: Path) -> dict[str, str]:
    from tests.conftest import cli_env

    return cli_env(XDG_CACHE_HOME=str(cache))

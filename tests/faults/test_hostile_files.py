"""Issue 38: files from elsewhere (config.json, measured and learned profiles, replay tables, the
profile cache) cannot steer, hang or lock out a sweep. Each case is a hostile file the adversarial
pass made; each must be one line naming the file and the field (exit 2), or be used harmlessly."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import yaml

from sweeper.errors import SpecError, SweepError
from sweeper.files import FileRefused, parse_json, parse_yaml, read_limited
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec
from tests.spec.test_hf_config import LLAMA31_8B, QWEN15_MOE_A27B


def hf_sweep(tmp_path: Path, config: dict | str | None = None):
    if config is not None:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(base_spec(model={"hf_config": "config.json"}, space={"tp": [1]})))
    return load_sweep(path)


# ---- the one reader ----------------------------------------------------------------------------
def test_a_device_or_fifo_is_refused_before_it_is_read(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    for name, kind in (("zero", "a character device"), ("fifo", "a FIFO")):
        done: list[str] = []
        reader = threading.Thread(target=lambda n=name, out=done: out.append(_refusal(tmp_path / n)), daemon=True)
        reader.start()
        reader.join(5)
        assert done, f"reading {name} did not end"
        assert done[0] == f"{tmp_path / name}: {kind}; only a regular file is read here"


def _refusal(path: Path) -> str:
    try:
        read_limited(path, max_bytes=1 << 20)
    except FileRefused as e:
        return str(e)
    return "read"


def test_the_size_is_bounded_before_reading(tmp_path):
    big = tmp_path / "sparse.json"
    with open(big, "wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes: reading it all took 15 s and 3.2 GB
    start = time.monotonic()
    with pytest.raises(FileRefused, match=r"3221225472 bytes; at most 1048576 are read here"):
        read_limited(big, max_bytes=1 << 20)
    assert time.monotonic() - start < 1


def test_json_numbers_keys_and_depth_are_bounded(tmp_path):
    p = tmp_path / "c.json"
    cases = {
        '{"a": 1' + "0" * 5000 + "}": "a: an integer of 5001 digits; at most 18",
        '{"a": [1, NaN]}': "a[1]: NaN is not a finite number",
        '{"a": 1e400}': "a: 1e400 is not a finite number",
        '{"a": 1, "a": 2}': "a: given twice; a key may appear once",
        "[" * 200_000 + "]" * 200_000: "nested 200000 levels deep; at most 32",
    }
    for text, message in cases.items():
        with pytest.raises(FileRefused) as info:
            parse_json(text.encode(), p)
        assert str(info.value) == f"{p}: {message}"


def test_yaml_numbers_and_keys_are_bounded():
    for text, message in {
        "a: 1" + "0" * 400: "a: an integer of 401 digits; at most 18",
        "a: [1.0, .inf]": "item 2: .inf is not a finite number",
        "a: 1.0e+400": "a: 1.0e+400 is not a finite number",
        "a: 1\na: 2": "duplicate key 'a'",
    }.items():
        with pytest.raises(FileRefused, match=re.escape(message)):
            parse_yaml(text, "f.yaml")


# ---- model: {hf_config: ...} ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "message"),
    [
        # 2.3 GB and growing after 40 s: the per-layer loop ran before the layer limit
        ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers = 1000000000; allowed: 1 to 100000"),
        ({"mlp_only_layers": 5}, "mlp_only_layers must be a list of block numbers, got 5"),
        ({"mlp_only_layers": [[1]]}, "mlp_only_layers must be a list of block numbers, got [[1]]"),
        ({"shared_expert_intermediate_size": "abc"}, "shared_expert_intermediate_size must be a whole number"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size = 0; an expert's MLP is at least 1 wide"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
    ],
)
def test_a_hostile_moe_config_is_one_line(tmp_path, change, message):
    start = time.monotonic()
    with pytest.raises(SpecError, match="model.hf_config: .*config.json: ") as info:
        hf_sweep(tmp_path, {**QWEN15_MOE_A27B, **change})
    assert message in str(info.value) and "\n" not in str(info.value)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"num_hidden_layers": 1' + "0" * 5000 + "}", "num_hidden_layers: an integer of 5001 digits"),
        ("[" * 200_000 + "]" * 200_000, "nested 200000 levels deep; at most 32"),
        (json.dumps(LLAMA31_8B)[:-1] + ', "vocab_size": 7}', "vocab_size: given twice"),
    ],
)
def test_a_hostile_config_text_is_one_line(tmp_path, text, message):
    with pytest.raises(SpecError, match=message):
        hf_sweep(tmp_path, text)


def test_a_config_that_is_a_device_or_a_fifo_is_refused(tmp_path):
    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(SpecError, match="config.json: a character device; only a regular file is read here"):
        hf_sweep(tmp_path)
    (tmp_path / "config.json").unlink()
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(SpecError, match="config.json: a FIFO; only a regular file is read here"):
        hf_sweep(tmp_path)


def test_the_config_errors_are_sweep_errors():
    assert issubclass(FileRefused, SweepError) and FileRefused.exit_code == 2


# ---- measured profiles ---------------------------------------------------------------------------
def _profile_file(tmp_path: Path, edit=None, name: str = "p.yaml") -> Path:
    from tests.profiles.test_profile import synthetic_profile

    data = synthetic_profile().to_dict()
    if edit is not None:
        edit(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_profiles_row_order_does_not_move_its_predictions(tmp_path):
    from sweeper.estimate.predict import predict
    from sweeper.layouts.layout import Layout
    from tests.profiles.test_profile import tiny_sweep

    def reverse(d: dict) -> None:
        for k in ("collectives", "gemm", "elementwise", "attention"):
            d[k] = d[k][::-1]

    a, b = _profile_file(tmp_path), _profile_file(tmp_path, reverse, "rev.yaml")
    _, sa = tiny_sweep(tmp_path, profile=str(a))
    _, sb = tiny_sweep(tmp_path, profile=str(b))
    cols = Layout.from_mapping({"tp": 2, "pp": 1, "micro_batch_size": 2}).columns(sa)
    # reversed collectives moved a predicted MFU from 0.0218 to 0.0089 (np.interp over unsorted sizes)
    assert predict(cols, sb).mfu[0] == predict(cols, sa).mfu[0]
    assert predict(cols, sb).parts["tp_comm"][0] == predict(cols, sa).parts["tp_comm"][0] > 0


def _first(d: dict, table: str, **change) -> None:
    d[table][0] = {**d[table][0], **change}


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (
            lambda d: _first(d, "collectives", busbw_gbps=0.0),
            "collectives.0.busbw_gbps: Input should be greater than 0",
        ),
        (lambda d: _first(d, "gemm", fwd_s=1e300), "gemm.0.fwd_s: Input should be less than 1000000"),
        (lambda d: _first(d, "gemm", m="16"), "gemm.0.m: Input should be a valid integer"),
        (lambda d: _first(d, "gemm", m=True), "gemm.0.m: Input should be a valid integer"),
        (lambda d: _first(d, "gemm", m=16.0), "gemm.0.m: Input should be a valid integer"),
        (lambda d: d.update(processes="2"), "processes: Input should be a valid integer"),
        # a name no measurement writes, printed on every dry run's profile line (issue 48)
        (lambda d: d.update(device="x" * 100_000), "device: String should have at most 200 characters"),
        (
            lambda d: d.update(block_base={f"k{i}": "v" for i in range(1000)}),
            "block_base: Dictionary should have at most 64 items",
        ),
    ],
)
def test_an_impossible_profile_number_is_one_line(tmp_path, edit, words):
    from sweeper.profiles.profile import ProfileError, load_profile

    with pytest.raises(ProfileError) as info:
        load_profile(_profile_file(tmp_path, edit))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_huge_integer_in_a_profile_is_one_line(tmp_path):
    from sweeper.profiles.profile import ProfileError, load_profile

    path = _profile_file(tmp_path)
    path.write_text(path.read_text().replace("processes: 2", "processes: 1" + "0" * 400))
    with pytest.raises(ProfileError, match="processes: an integer of 401 digits; at most 18"):
        load_profile(path)


def test_profile_show_on_a_device_or_a_sparse_file_is_one_line(tmp_path):
    from tests.conftest import sweep_cli

    big = tmp_path / "big.profile.yaml"
    with open(big, "wb") as f:
        f.truncate(3 << 30)
    for path, words in (("/dev/zero", "a character device"), (str(big), "3221225472 bytes; at most 8388608")):
        r = sweep_cli("profile", "show", path, cwd=tmp_path)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_cached_profile_others_may_write_is_refused(tmp_path, monkeypatch):
    from sweeper.profiles.cache import cached_profile_path
    from sweeper.profiles.profile import save_profile
    from tests.profiles.test_profile import synthetic_profile, tiny_sweep

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = cached_profile_path("cpu")
    save_profile(synthetic_profile(), path)
    path.chmod(0o666)
    with pytest.raises(SpecError) as info:
        tiny_sweep(tmp_path)
    assert str(info.value).endswith(f"{path}: writable by others (mode 666); `chmod go-w {path}` makes it yours alone")
    path.chmod(0o600)
    path.parent.chmod(0o777)
    with pytest.raises(SpecError, match=f"{path.parent}: writable by others"):
        tiny_sweep(tmp_path)
    path.parent.chmod(0o755)
    assert tiny_sweep(tmp_path)[1].cluster.profile is not None
    if os.geteuid() == 0:  # as root: a profile another user owns
        os.chown(path, 4242, 4242)
        with pytest.raises(SpecError, match=f"{path}: owned by user 4242, not you"):
            tiny_sweep(tmp_path)


# ---- sweep profile forget -------------------------------------------------------------------------
def test_forget_deletes_only_cached_profiles(tmp_path):
    from sweeper.profiles.profile import save_profile
    from tests.conftest import cli_env, sweep_cli
    from tests.profiles.test_profile import synthetic_profile

    env = cli_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "sweep" / "profiles"
    cache.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.profile.yaml").write_text("not a profile\n")
    save_profile(synthetic_profile(), victim / "valid.profile.yaml")
    (cache / "dir.profile.yaml").mkdir()
    (cache / "junk.profile.yaml").write_text("junk: 1\n")
    cases = [
        (("--gpu", "../../../victim/notes"), "not a GPU table key"),
        ((str(victim / "valid.profile.yaml"),), "is not a cached profile"),
        ((str(victim / "notes.profile.yaml"),), "is not a cached profile"),
        (("--gpu", "dir"), "is not a regular file"),  # was an IsADirectoryError traceback
        (("--gpu", "junk"), "not a measured profile"),
    ]
    for args, words in cases:
        r = sweep_cli("profile", "forget", *args, cwd=tmp_path, env=env)
        assert r.returncode == 2 and words in r.stderr and "nothing deleted" in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in victim.iterdir()) == ["notes.profile.yaml", "valid.profile.yaml"]
    assert (cache / "dir.profile.yaml").is_dir() and (cache / "junk.profile.yaml").is_file()
    save_profile(synthetic_profile(), cache / "cpu.profile.yaml")
    r = sweep_cli("profile", "forget", cwd=tmp_path, env=env)  # every cached profile: only the real ones
    assert r.returncode == 0 and f"deleted {cache / 'cpu.profile.yaml'}" in r.stdout, r.stderr
    assert (cache / "junk.profile.yaml").is_file() and not (cache / "cpu.profile.yaml").exists()


# ---- learned profiles -----------------------------------------------------------------------------
POISONED = """schema: 1
kind: learned
cluster: 2xcpu
gpu: cpu
trainer: builtin
sweeps:
- id: 4dab79cf5c17ac4d
  name: elsewhere
  model: custom
  nodes: 1
  date: '2026-11-01T00:00:00+00:00'
  trials: 3
  measured: 3
  calibration: {compute_scale: 2.4, comm_scale: 1.6, trials: 3}
  effects:
  - {knob: activation_checkpointing, value: none, log_ratio: LOG, trials: TRIALS}
"""


def _learning_sweep(tmp_path: Path) -> Path:
    """The demo sweep with learning on (it is off by default): only then is a learned profile read."""
    from tests.conftest import SPACES

    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.setdefault("search", {})["learned_profile"] = True
    path = tmp_path / "tiny_cpu.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# an implausible learned *number* (log_ratio 1e300) is refused and said where it is used, the rest of
# the file kept (tests/search/test_learned.py); a field of the wrong type refuses the whole file here
@pytest.mark.parametrize(
    ("log", "trials", "words"),
    [
        ("0.1", "1.0e+30", "trials: Input should be a valid integer"),
        ("0.1", '"3"', "trials: Input should be a valid integer"),
    ],
)
def test_a_poisoned_learned_profile_is_refused_in_one_line(tmp_path, log, trials, words):
    from tests.conftest import cli_env, sweep_cli

    learned = tmp_path / "cache" / "sweep" / "profiles" / "learned"
    learned.mkdir(parents=True)
    path = learned / "2xcpu__cpu__builtin.yaml"
    path.write_text(POISONED.replace("LOG", log).replace("TRIALS", trials))
    env = cli_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = sweep_cli("run", str(_learning_sweep(tmp_path)), "--dry-run", cwd=tmp_path, env=env)
    assert r.returncode == 2 and words in r.stderr and str(path) in r.stderr, r.stderr
    assert "forget --learned" in r.stderr and "Traceback" not in r.stderr
    r = sweep_cli("profile", "show", str(path), cwd=tmp_path, env=env)  # was an OverflowError
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_learned_profile_in_a_folder_others_may_write_is_refused(tmp_path):
    from tests.conftest import cli_env, sweep_cli

    learned = tmp_path / "cache" / "sweep" / "profiles" / "learned"
    learned.mkdir(parents=True)
    (learned / "2xcpu__cpu__builtin.yaml").write_text(POISONED.replace("LOG", "0.1").replace("TRIALS", "3"))
    learned.chmod(0o777)
    env = cli_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = sweep_cli("run", str(_learning_sweep(tmp_path)), "--dry-run", cwd=tmp_path, env=env)
    assert r.returncode == 2 and f"{learned}: writable by others (mode 777); `chmod go-w {learned}`" in r.stderr, (
        r.stderr
    )


# ---- replay tables: impossible numbers ------------------------------------------------------------
def _replay(tmp_path: Path, rows: str, name: str = "rep", **extra) -> Path:
    (tmp_path / f"{name}.csv").write_text(rows)
    spec = {
        "name": name,
        "model": {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn": 5632, "vocab": 32000},
        "seq_len": 4096,
        "global_batch_size": 512,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1]},
        "trial": {"steps": 4, "warmup_steps": 1},
        "search": {"max_trials": 4, "parallel": 1},
        "launcher": {"kind": "replay", "table": f"{name}.csv"},
        "results_dir": str(tmp_path / "results"),
    } | extra
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


IMPOSSIBLE = (
    "tp,pp,micro_batch_size,status,step_times_s,mfu\n"
    '1,1,1,ok,"[1.0, 0.5, 0.5, 0.5]",\n'
    '1,2,1,ok,"[1.0, -0.5, -0.5, -0.5]",\n'
    '2,1,1,ok,"[1.0, NaN, NaN, NaN]",\n'
    '2,2,1,ok,"[1.0, 0.6, 0.6, 0.6]",5.0\n'
)


def test_impossible_replay_numbers_make_failed_rows_never_a_wedge(tmp_path):
    import pandas as pd

    from tests.conftest import sweep_cli

    spec = _replay(tmp_path, IMPOSSIBLE)
    for _ in range(2):  # negative times wedged every later run (residuals not finite) until --fresh
        r = sweep_cli("run", str(spec), cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    d = pd.read_parquet(tmp_path / "results" / "rep" / "trials").set_index(["tp", "pp"])
    assert d.loc[(1, 1), "status"] == "ok" and 0 < d.loc[(1, 1), "mfu"] <= 1
    for key, words in {
        (1, 2): "step 2 took -0.5 s",
        (2, 1): "step 2 took nan s",
        (2, 2): "mfu is 5.0; an MFU is a fraction of the peak, in (0, 1]",
    }.items():
        assert d.loc[key, "status"] == "failed" and pd.isna(d.loc[key, "mfu"]), d.loc[key]
        assert words in d.loc[key, "error"]
    r = sweep_cli("best", str(spec), cwd=tmp_path)  # mfu 5.0 won `sweep best`
    assert r.returncode == 0 and "0.6" not in r.stdout.split("\n")[0]


def test_an_ok_row_written_with_impossible_numbers_reads_as_failed(tmp_path):
    from sweeper.results.rows import ResultsStore
    from sweeper.results.trial import impossible

    store = ResultsStore(tmp_path / "r")
    store.ensure()
    store.write_row({"trial_number": 0, "status": "ok", "mfu": -0.004, "step_times_s": [1.0, -0.5]})
    (row,) = store.rows()
    assert row["status"] == "failed" and row["mfu"] is None and "step 2 took -0.5 s" in row["error"]
    assert any("as failed: impossible numbers" in w for w in store.warnings)
    assert impossible({"status": "ok", "mfu": 0.5, "step_times_s": [0.1, 0.2]}) is None


# ---- a relative cluster.profile does not lock the results -------------------------------------------
def test_results_open_after_their_profile_moved(tmp_path):
    from tests.conftest import sweep_cli

    rel = tmp_path / "rel"
    rel.mkdir()
    _profile_file(rel, name="cpu.profile.yaml")
    spec = _replay(
        rel,
        "tp,pp,micro_batch_size,status,mfu,step_time_mean_s\n1,1,1,ok,0.02,1.0\n1,1,2,ok,0.03,0.8\n",
        name="relprof",
        model={"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 176, "vocab": 256},
        seq_len=64,
        global_batch_size=8,
        cluster={"nodes": 1, "gpus_per_node": 2, "gpu": "cpu", "profile": "cpu.profile.yaml"},
        space={"tp": [1], "pp": [1], "micro_batch_size": [1, 2]},
        results_dir="results",
    )
    r = sweep_cli("run", spec.name, cwd=rel)
    assert r.returncode == 0, r.stderr[-2000:]
    kept = rel / "results" / "relprof" / "profile.yaml"
    assert kept.is_file() and "profile: profile.yaml" in (kept.parent / "sweep.yaml").read_text()
    (rel / "cpu.profile.yaml").rename(tmp_path / "moved.profile.yaml")
    for command in ("best", "status", "report", "run"):
        r = sweep_cli(command, spec.name, cwd=rel)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    # from another folder, the results named by the sweep file's own folder
    r = sweep_cli("best", str(spec), "--results", str(kept.parent), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


# ---- a row file edited to a node count the sweep never ran ------------------------------------------
def test_a_row_of_a_node_count_the_sweep_never_ran_is_skipped_with_a_warning(tmp_path):
    import pyarrow.parquet as pq

    from tests.conftest import sweep_cli

    spec = _replay(
        tmp_path,
        "tp,pp,micro_batch_size,status,mfu\n1,1,1,ok,0.30\n1,2,1,ok,0.20\n2,1,1,ok,0.25\n2,2,1,ok,0.10\n",
    )
    assert sweep_cli("run", str(spec), cwd=tmp_path).returncode == 0
    rows = sorted((tmp_path / "results" / "rep" / "trials").glob("trial-*.parquet"))
    table = pq.read_table(rows[0])
    best_before = table.column("mfu")[0].as_py()
    pq.write_table(table.set_column(table.schema.get_field_index("nodes"), "nodes", [[3]]), rows[0])
    for command in (("best", str(spec)), ("compare", str(spec), str(spec))):
        r = sweep_cli(*command, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"skipped {rows[0]}: nodes 3 is not a node count of the sweep (8)" in " ".join(r.stderr.split()), (
            command,
            r.stderr,
        )
    assert best_before is not None


# ---- a killed `sweep profile` leaves no measuring folder --------------------------------------------
def test_a_killed_profiles_folder_is_removed_by_the_next(tmp_path):
    import subprocess

    from sweeper.run.profiler import WORKDIR_PREFIX, remove_stale_workdirs

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"{WORKDIR_PREFIX}{gone.pid}-abc"
    (stale / "out").mkdir(parents=True)
    (stale / "task.pkl").write_bytes(b"x")
    live = tmp_path / f"{WORKDIR_PREFIX}{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / f"{WORKDIR_PREFIX}notapid-x"
    other.mkdir()
    assert remove_stale_workdirs(tmp_path) == [stale]
    assert not stale.exists() and live.is_dir() and other.is_dir()

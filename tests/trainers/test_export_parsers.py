"""Every export of a grid of layouts, parsed and validated by the trainers' own code.

- torchtitan 0.3.x (`--format torchtitan-cli`, `workload: torchtitan`): its ConfigManager on our
  overrides, ParallelDims, and its pipeline stage-to-rank mapping (the `test` extra installs it).
- torchtitan 0.2.2 (`--format torchtitan`, TOML): its ConfigManager on our TOML file; the wheel is
  fetched from PyPI at test time (it cannot share an environment with 0.3).
- Megatron-LM: `parse_args` (add_megatron_arguments) + `validate_args` of
  megatron/training/arguments.py at NVIDIA/Megatron-LM c1e938b. It is not on PyPI (megatron-core
  lacks megatron/training): SWEEP_MEGATRON_LM names a tree holding that commit's `megatron/`, else
  the archive of that tree in ../shared/reference/megatron-lm/ (beside the repository) is read,
  else it is downloaded from GitHub at test time; with none of them the Megatron tests skip saying
  so, except in CI (`CI=true`), where they fail: CI runs every reference case.
The harnesses under tests/parsers/ run in subprocesses, one per trainer for all its cases.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Layout
from sweeper.runtime.workloads import render_command, workload_env
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep
from sweeper.statuses import PlanReason
from sweeper.trainers.export import (
    MEGATRON_COMMIT,
    TORCHTITAN_CLI_VERSION,
    TORCHTITAN_TOML_VERSION,
    layout_record,
    megatron_args,
    megatron_env,
    pipeline_stages,
    to_torchtitan,
    to_torchtitan_cli,
    torchtitan_cli_args,
)
from sweeper.trainers.export_moe import torchtitan_model
from tests.conftest import ROOT, base_spec, missing_reference

PARSERS = Path(__file__).parents[1] / "parsers"
CACHE = Path(os.environ.get("SWEEP_TEST_CACHE", Path.home() / ".cache" / "sweep-tests"))
# `git archive` of the pinned commit's megatron/ tree, kept beside the repository (its README says why)
MEGATRON_ARCHIVE = ROOT.parent / "shared" / "reference" / "megatron-lm" / f"megatron-lm-{MEGATRON_COMMIT[:7]}.tar.gz"
WORLD = 64


def sweep_of(layers: int, **extra: Any) -> Sweep:
    model = {"layers": layers, "hidden": 5120, "heads": 40, "kv_heads": 8, "ffn": 13824, "vocab": 32000}
    return parse_sweep(
        yaml.safe_dump(base_spec(model=model, cluster={"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"}, **extra))
    )


def layout_row(sweep: Sweep, **knobs: Any) -> dict[str, Any]:
    lay = Layout(**knobs)
    return {
        "trial_number": 1,
        "mfu": 0.5,
        **lay.as_dict(),
        "dp": lay.dp(WORLD),
        "grad_accum": lay.grad_accum(WORLD, sweep.global_batch_size),
        "num_devices": WORLD,
    }


def grid() -> list[tuple[str, Sweep, dict[str, Any]]]:
    """tp x pp x sharding x schedule, with checkpointing modes, sp, compile, float8 and micro-batches
    cycling through the combinations; 40 layers (even splits, and 16 uneven stages at pp=8 interleaved)
    and 30 layers (uneven at pp=4 and pp=8, interleaved and not)."""
    s40, s30 = sweep_of(40), sweep_of(30)
    cases, i = [], 0
    for sweep, pairs in ((s40, [(1, 1), (2, 1), (8, 1), (1, 2), (2, 2), (4, 4), (1, 8)]), (s30, [(2, 4), (1, 8)])):
        for tp, pp in pairs:
            for sharding in KNOBS["sharding"].choices:
                for sched in KNOBS["pp_schedule"].choices if pp > 1 else ("1f1b",):
                    i += 1
                    knobs = {
                        "tp": tp,
                        "pp": pp,
                        "sharding": sharding,
                        "pp_schedule": sched,
                        "virtual_stages": 2 if sched == "interleaved" else 1,
                        "activation_checkpointing": KNOBS["activation_checkpointing"].choices[i % 4],
                        "sequence_parallel": tp > 1 and i % 2 == 0,
                        "compile": i % 3 == 0,
                        "float8": i % 2 == 1,
                        "micro_batch_size": 1 + i % 2,
                        "attention": ("flash2", "cudnn", "eager")[i % 3],
                    }
                    name = f"L{sweep.model.layers}-" + "-".join(f"{k}={v}" for k, v in knobs.items())
                    cases.append((name, sweep, layout_row(sweep, **knobs)))
    return cases


GRID = grid()
IDS = [c[0] for c in GRID]


def run_harness(script: str, cases: list[dict[str, Any]], pythonpath: str | None = None) -> list[dict[str, Any]]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(PARSERS / script)],
        input="".join(json.dumps(c) + "\n" for c in cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=PARSERS,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == len(cases), f"{script} answered {len(lines)} of {len(cases)} cases:\n{proc.stderr[-3000:]}"
    return [json.loads(ln) for ln in lines]


# ---- torchtitan 0.3 (command-line overrides) --------------------------------------------
def workload_argvs() -> list[list[str]]:
    """`workload: torchtitan` renders the same overrides plus steps and log frequency; booleans tyro-style."""
    sweep = sweep_of(40, workload={"kind": "torchtitan", "command": "train {flags} --training.max_norm 2.0"})
    layouts = [
        Layout(tp=2, pp=2, compile=False, activation_checkpointing="full"),
        Layout(tp=1, pp=1, compile=True, sharding="fsdp"),
    ]
    return [render_command(sweep.workload.command, sweep, lay, "torchtitan")[1:] for lay in layouts]


WORKLOAD_IDS = ["workload-tp2-pp2", "workload-fsdp-compile"]


@pytest.fixture(scope="module")
def titan_cli_answers() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """torchtitan 0.3's answers, one harness run for all (each run imports torch and torchtitan anew):
    to the grid's exports and the workload commands, by id; then to the MoE and cp cases
    (`titan_cli_moe_cases`), in order."""
    try:
        version = importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchtitan is not installed (pip install -e '.[test]')")
    if version.split(".")[:2] != TORCHTITAN_CLI_VERSION.split(".")[:2]:
        pytest.skip(f"torchtitan {version} installed; the CLI export targets {TORCHTITAN_CLI_VERSION}")
    cases = [{"argv": torchtitan_cli_args(layout_record(row, sweep))[0], "world": WORLD} for _, sweep, row in GRID]
    cases += [{"argv": argv, "world": WORLD} for argv in workload_argvs()]
    answers = run_harness("torchtitan_cli.py", cases + titan_cli_moe_cases())
    return dict(zip([*IDS, *WORKLOAD_IDS], answers[: len(cases)])), answers[len(cases) :]


@pytest.fixture(scope="module")
def titan_cli(titan_cli_answers) -> dict[str, dict[str, Any]]:
    """torchtitan 0.3's answers to the grid's exports and to the workload commands, by id."""
    return titan_cli_answers[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS, ids=IDS)
def test_torchtitan_cli_export_is_accepted(titan_cli, name):
    _, sweep, row = GRID[IDS.index(name)]
    got = titan_cli[name]
    assert got["ok"], got["error"]
    rec = layout_record(row, sweep)
    assert (got["tp"], got["pp"], got["dp_replicate"] * got["dp_shard"]) == (rec["tp"], rec["pp"], rec["dp"])
    # 0.3 wraps every layout in fully_shard: replicate degree dp (shard 1) is what DDP measured
    assert got["dp_shard"] == (rec["dp"] if rec["sharding"] == "fsdp" else 1)
    stages = pipeline_stages(rec)
    assert [sum(m.startswith("layers.") for m in p) for p in got["parts"] or []] == list(stages)
    assert got["ac"] == {"none": "NoneType", "full": "FullAC.Config"}.get(
        rec["activation_checkpointing"], "SelectiveAC.Config"
    )
    assert got["compile"] == rec["compile"]
    if rec["tp"] > 1:
        assert got["sp"] == rec["sequence_parallel"]
    _, notes = torchtitan_cli_args(rec)
    if rec["float8"]:  # no switch on the 0.3 command line: the export says so
        assert any(n.startswith("float8=true: torchtitan 0.3 has no command-line switch") for n in notes)


@pytest.mark.slow
def test_torchtitan_workload_flags_are_accepted(titan_cli):
    """`workload: torchtitan` renders the same overrides plus steps and log frequency; booleans tyro-style."""
    argvs = workload_argvs()
    assert "--compile.no-enable" in argvs[0] and "--compile.enable" in argvs[1]
    assert argvs[0][-1] == "activation-checkpoint:full"  # after the template's own words: tyro's subcommand
    assert not any("=false" in a or "=true" in a for a in argvs[0] + argvs[1])
    for name in WORKLOAD_IDS:  # parsed by torchtitan in the module's one harness run
        assert titan_cli[name]["ok"], titan_cli[name]["error"]


# ---- torchtitan 0.2 (TOML) ---------------------------------------------------------------
def titan_toml_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torchtitan 0.2.2's files, unpacked from its wheel (cached; fetched from PyPI the first time)."""
    root = CACHE / f"torchtitan-{TORCHTITAN_TOML_VERSION}"
    if not (root / "torchtitan" / "config" / "manager.py").exists():
        dl = tmp_path_factory.mktemp("wheel")
        got = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(dl),
                f"torchtitan=={TORCHTITAN_TOML_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        wheels = list(dl.glob("*.whl"))
        if got.returncode or not wheels:
            pytest.skip(f"cannot fetch torchtitan {TORCHTITAN_TOML_VERSION} from PyPI: {got.stderr.strip()[-300:]}")
        zipfile.ZipFile(wheels[0]).extractall(root)
    return root


@pytest.fixture(scope="module")
def titan_toml_answers(tmp_path_factory) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """torchtitan 0.2.2's answers, one harness run for all: to the grid's TOML exports, by id; then to
    the MoE and cp ones (`titan_toml_moe_cases`), in order."""
    root = titan_toml_tree(tmp_path_factory)
    out = tmp_path_factory.mktemp("toml")
    cases = []
    for i, (_, sweep, row) in enumerate(GRID):
        path = out / f"{i}.toml"
        path.write_text(to_torchtitan(row, sweep))
        cases.append({"toml": str(path), "world": WORLD})
    answers = run_harness("torchtitan_toml.py", cases + titan_toml_moe_cases(out), pythonpath=str(root))
    return dict(zip(IDS, answers[: len(cases)])), answers[len(cases) :]


@pytest.fixture(scope="module")
def titan_toml(titan_toml_answers) -> dict[str, dict[str, Any]]:
    """torchtitan 0.2.2's answers to the grid's TOML exports, by id."""
    return titan_toml_answers[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS, ids=IDS)
def test_torchtitan_toml_export_is_accepted(titan_toml, name):
    _, sweep, row = GRID[IDS.index(name)]
    got = titan_toml[name]
    assert got["ok"], got["error"]
    rec = layout_record(row, sweep)
    assert got["dp_replicate"] * got["dp_shard"] == rec["dp"]
    assert [sum(m.startswith("layers.") for m in p) for p in got["parts"] or []] == list(pipeline_stages(rec))
    if got["parts"]:
        assert got["parts"][0][0] == "tok_embeddings" and got["parts"][-1][-2:] == ["norm", "output"]
    assert got["ac"] == {"ffn": "selective"}.get(rec["activation_checkpointing"], rec["activation_checkpointing"])
    assert got["converters"] == (["quantize.linear.float8"] if rec["float8"] else [])
    text = to_torchtitan(row, sweep)
    if rec["sharding"] != "fsdp" and (rec["tp"] > 1 or rec["pp"] > 1):
        assert "DDP has not supported > 1D parallelism" in text


# ---- Megatron-LM -------------------------------------------------------------------------
def extract_megatron(tar: tarfile.TarFile, root: Path) -> Path:
    """The `megatron/` files of GitHub's tarball of the pinned commit, written under `root`."""
    top = f"Megatron-LM-{MEGATRON_COMMIT}/"
    members = [m for m in tar.getmembers() if m.name.startswith(top + "megatron/") and m.isfile()]
    assert members, f"{tar.name or 'the download'} holds no {top}megatron/: not the pinned commit"
    for m in members:
        m.name = m.name.removeprefix(top)
    tar.extractall(root, members=members, filter="data")
    return root


def megatron_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding megatron/ of the pinned commit: SWEEP_MEGATRON_LM, the archive beside the
    repository, the cache of an earlier download, or a download from GitHub."""
    if os.environ.get("SWEEP_MEGATRON_LM"):
        return Path(os.environ["SWEEP_MEGATRON_LM"])
    if MEGATRON_ARCHIVE.is_file():
        with tarfile.open(MEGATRON_ARCHIVE) as tar:
            return extract_megatron(tar, tmp_path_factory.mktemp("megatron-lm"))
    root = CACHE / f"megatron-lm-{MEGATRON_COMMIT[:12]}"
    if (root / "megatron" / "training" / "arguments.py").exists():
        return root
    url = f"https://codeload.github.com/NVIDIA/Megatron-LM/tar.gz/{MEGATRON_COMMIT}"
    try:
        data = urllib.request.urlopen(url, timeout=30).read()
    except OSError as e:
        missing_reference(
            MEGATRON_ARCHIVE,
            f"Megatron-LM's arguments.py is not on PyPI and {url} cannot be fetched ({e}); set "
            f"SWEEP_MEGATRON_LM to a tree of NVIDIA/Megatron-LM at {MEGATRON_COMMIT}",
        )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return extract_megatron(tar, root)


def megatron_model_args(sweep: Sweep) -> list[str]:
    m = sweep.model
    return [
        "--num-layers",
        str(m.layers),
        "--hidden-size",
        str(m.hidden),
        "--num-attention-heads",
        str(m.heads),
        "--group-query-attention",
        "--num-query-groups",
        str(m.kv_heads),
        "--ffn-hidden-size",
        str(m.ffn),
        "--max-position-embeddings",
        str(sweep.seq_len),
        "--position-embedding-type",
        "rope",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--train-iters",
        "10",
        "--lr",
        "1e-4",
        "--mock-data",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        str(m.vocab),
    ]


@pytest.fixture(scope="module")
def megatron_answers(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Megatron-LM's answers, one harness run for all (each imports torch and Megatron anew, from one
    extracted tree): to the grid's exports and an FSDP layout's old workload variable, by id; then to the
    MoE and cp cases (`megatron_moe_cases`), in order."""
    tree = megatron_tree(tmp_path_factory)
    cases = []
    for _, sweep, row in GRID:
        rec = layout_record(row, sweep)
        env, _ = megatron_env(rec)
        cases.append({"argv": megatron_model_args(sweep) + megatron_args(rec)[0], "env": env, "world": WORLD})
    # what the README's workload example used to set, on an FSDP layout: Megatron-FSDP refuses it
    fsdp = next((s, r) for _, s, r in GRID if r["sharding"] == "fsdp")
    cases.append(
        {
            "argv": megatron_model_args(fsdp[0]) + megatron_args(layout_record(fsdp[1], fsdp[0]))[0],
            "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
            "world": WORLD,
        }
    )
    answers = run_harness("megatron_validate.py", cases + megatron_moe_cases(), pythonpath=str(tree))
    return dict(zip([*IDS, "fsdp-with-max-connections-1"], answers[: len(cases)])), answers[len(cases) :]


@pytest.fixture(scope="module")
def megatron(megatron_answers) -> dict[str, dict[str, Any]]:
    """Megatron-LM's answers to the grid's exports and the FSDP case, by id."""
    return megatron_answers[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS, ids=IDS)
def test_megatron_export_is_accepted(megatron, name):
    _, sweep, row = GRID[IDS.index(name)]
    got = megatron[name]
    assert got["ok"], got["error"]
    rec = layout_record(row, sweep)
    assert got["dp"] == rec["dp"]
    stages = pipeline_stages(rec)
    assert (got["vpp"] or 1) == (len(stages) // rec["pp"] if stages else 1)
    assert (got["ckpt_format"] == "fsdp_dtensor") == (rec["sharding"] == "fsdp")


@pytest.mark.slow
def test_megatron_fsdp_refuses_one_device_connection(megatron):
    got = megatron["fsdp-with-max-connections-1"]
    assert not got["ok"] and "CUDA_DEVICE_MAX_CONNECTIONS" in got["error"]


def test_workload_env_drops_what_megatron_fsdp_refuses(tmp_path):
    sweep = sweep_of(
        40,
        workload={
            "kind": "megatron",
            "command": "pretrain_gpt.py {flags}",
            "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        },
    )
    env, notes = workload_env(sweep, Layout(sharding="fsdp"))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env and "Megatron-FSDP refuses it" in notes[0]
    env, notes = workload_env(sweep, Layout(tp=2))
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and notes == []
    bare = sweep_of(40, workload={"kind": "megatron", "command": "pretrain_gpt.py {flags}"})
    env, notes = workload_env(bare, Layout(tp=2))
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and "set to 1" in notes[0]


# ---- context parallel, expert parallel and mixture-of-experts models ---------------------
# The three MoE shapes each map a different way: a preset torchtitan ships (qwen3-30b-a3b), one it
# does not (mixtral-8x7b), and a custom one with shared experts, leading dense layers and a sigmoid
# router (a DeepSeek-V2-Lite-like MLP with grouped-query attention); a top-1 router, and a dense
# model with cp. Each layout is one the plan accepts for that trainer (asserted in `moe_case`).
SIGMOID_MOE = {
    "layers": 27,
    "hidden": 2048,
    "heads": 16,
    "kv_heads": 16,
    "ffn": 10944,
    "vocab": 102400,
    "experts": 64,
    "experts_per_token": 6,
    "moe_ffn": 1408,
    "shared_experts": 2,
    "dense_layers": 1,
    "router": "sigmoid",
}
TOP1_MOE = {"layers": 24, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn": 8192, "vocab": 32000, "experts": 16}
TOP1_MOE |= {"experts_per_token": 1, "moe_ffn": 2048}
MOE_MODELS: dict[str, Any] = {"qwen3": "qwen3-30b-a3b", "mixtral": "mixtral-8x7b", "sigmoid": SIGMOID_MOE}
MOE_MODELS |= {"top1": TOP1_MOE, "dense": "llama-13b"}


def moe_sweep(model: str, kind: str) -> Sweep:
    command = "pretrain_gpt.py {flags}" if kind == "megatron" else "train {flags}"
    spec = base_spec(
        model=MOE_MODELS[model],
        seq_len=4096,
        global_batch_size=512,
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        workload={"kind": kind, "command": command},
        space={"tp": [1, 2, 4], "pp": [1, 2, 4], "micro_batch_size": [1, 2]},
    )
    return parse_sweep(yaml.safe_dump(spec))


# (model, knobs): cp and ep inside and across tp, pp, interleaving, sharding and checkpointing modes
MOE_LAYOUTS: list[tuple[str, dict[str, Any]]] = [
    ("qwen3", {"ep": 8, "etp": 1, "sharding": "zero1"}),
    ("qwen3", {"tp": 2, "sequence_parallel": True, "cp": 2, "ep": 8, "etp": 1, "sharding": "zero1"}),
    (
        "qwen3",
        {"tp": 2, "sequence_parallel": True, "pp": 2, "ep": 4, "pp_schedule": "interleaved", "virtual_stages": 2},
    ),
    ("qwen3", {"tp": 4, "sequence_parallel": True, "pp": 2, "cp": 2, "ep": 8, "etp": 1, "attention": "cudnn"}),
    ("qwen3", {"cp": 4, "ep": 16, "etp": 1, "sharding": "fsdp", "activation_checkpointing": "full"}),
    ("qwen3", {"ep": 4, "etp": 1, "activation_checkpointing": "ffn", "micro_batch_size": 2}),
    ("mixtral", {"tp": 2, "sequence_parallel": True, "ep": 4, "float8": True, "sharding": "zero1"}),
    ("mixtral", {"pp": 4, "ep": 8, "etp": 1, "activation_checkpointing": "selective"}),
    ("sigmoid", {"tp": 2, "sequence_parallel": True, "pp": 2, "ep": 8, "activation_checkpointing": "ffn"}),
    ("sigmoid", {"cp": 2, "ep": 16, "etp": 1, "sharding": "fsdp"}),
    ("top1", {"ep": 16, "etp": 1}),
    ("top1", {"tp": 2, "sequence_parallel": True, "cp": 2, "ep": 2, "etp": 2}),
    ("dense", {"tp": 2, "sequence_parallel": True, "cp": 2, "pp": 2, "activation_checkpointing": "selective"}),
    ("dense", {"cp": 4, "sharding": "fsdp", "attention": "cudnn"}),
]
MOE_IDS = [f"{m}-" + "-".join(f"{k}={v}" for k, v in knobs.items()) for m, knobs in MOE_LAYOUTS]


def moe_case(i: int, kind: str) -> tuple[Sweep, dict[str, Any]]:
    """The sweep and results row of MOE_LAYOUTS[i] for `kind`: megatron; torchtitan (0.3, the
    workload: etp = 1 under ep, tp without); torchtitan-0.2 (the TOML export: etp = 1 or tp, so its
    rows need pass every rule but the 0.3 workload's expert rule)."""
    model, knobs = MOE_LAYOUTS[i]
    sweep = moe_sweep(model, "megatron" if kind == "megatron" else "torchtitan")
    tp, ep, etp = knobs.get("tp", 1), knobs.get("ep", 1), knobs.get("etp", knobs.get("tp", 1))
    if kind == "torchtitan":
        knobs = knobs | {"etp": 1 if ep > 1 else tp}
    elif kind == "torchtitan-0.2" and etp not in (1, tp):
        knobs = knobs | {"etp": 1}
    lay = Layout(**knobs)
    why = lay.rejection(sweep)
    if kind == "torchtitan-0.2" and why is not None and why.code == PlanReason.EXPERTS_NOT_IN_WORKLOAD:
        why = None
    assert why is None, f"{MOE_IDS[i]} ({kind}): {why}"
    return sweep, layout_row(sweep, **knobs)


def megatron_moe_cases() -> list[dict[str, Any]]:
    """Megatron-LM's cases of the MoE and cp exports, TransformerConfig built for each."""
    cases = []
    for i in range(len(MOE_LAYOUTS)):
        sweep, row = moe_case(i, "megatron")
        rec = layout_record(row, sweep)
        model_args = megatron_model_args(sweep) + (["--qk-layernorm"] if sweep.model.qk_norm else [])
        argv = model_args + ["--no-rope-fusion"] + megatron_args(rec)[0]
        cases.append({"argv": argv, "env": megatron_env(rec)[0], "world": WORLD, "config": True})
    # ep with tp and no sequence parallel: the plan's ep_needs_sp rule, as Megatron-LM has it
    sweep, row = moe_case(1, "megatron")
    rec = layout_record(row, sweep) | {"sequence_parallel": False}
    argv = megatron_model_args(sweep) + ["--no-rope-fusion"] + megatron_args(rec)[0]
    cases.append({"argv": argv, "env": megatron_env(rec)[0], "world": WORLD, "config": True})
    # `workload: megatron` renders the same flags plus its iterations: a cp x ep layout's {flags}
    lay = Layout(**{k: row[k] for k in KNOBS})
    flags = render_command(sweep.workload.command, sweep, lay, "megatron")[1:]
    model_args = megatron_model_args(sweep)[: megatron_model_args(sweep).index("--train-iters")]
    argv = model_args + ["--qk-layernorm", "--no-rope-fusion", "--lr", "1e-4", "--mock-data"]
    argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(sweep.model.vocab), *flags]
    cases.append({"argv": argv, "env": workload_env(sweep, lay)[0], "world": WORLD, "config": True})
    return cases


@pytest.fixture(scope="module")
def megatron_moe(megatron_answers) -> list[dict[str, Any]]:
    """Megatron-LM's answers to `megatron_moe_cases`, in order."""
    return megatron_answers[1]


@pytest.mark.slow
def test_megatron_moe_and_cp_exports_are_accepted(megatron_moe):
    for i, name in enumerate(MOE_IDS):
        got = megatron_moe[i]
        assert got["ok"], f"{name}: {got['error']}"
        sweep, row = moe_case(i, "megatron")
        rec, m = layout_record(row, sweep), sweep.model
        assert (got["dp"], got["cp"]) == (rec["dp"], rec["cp"]), name
        if not m.is_moe:
            assert got["experts"] is None and got["ep"] == 1, name
            continue
        assert (got["ep"], got["etp"], got["experts"], got["topk"]) == (
            rec["ep"],
            rec["etp"],
            m.experts,
            m.experts_per_token,
        )
        assert got["moe_ffn"] == m.expert_ffn and got["shared"] == (m.shared_experts * m.expert_ffn or None), name
        # every layer an expert layer (1) but the leading dense ones
        freq = got["layer_freq"]
        assert (freq == 1) if not m.dense_layers else freq == [0] * m.dense_layers + [1] * m.moe_layers, name
        assert got["score"] == m.router, name


@pytest.mark.slow
def test_megatron_refuses_ep_and_tp_without_sequence_parallel(megatron_moe):
    got = megatron_moe[len(MOE_IDS)]
    assert not got["ok"] and "sequence parallelism must be used" in got["error"]


@pytest.mark.slow
def test_megatron_workload_flags_of_a_cp_ep_layout_are_accepted(megatron_moe):
    got = megatron_moe[len(MOE_IDS) + 1]
    assert got["ok"], got["error"]
    assert (got["cp"], got["ep"], got["etp"], got["experts"]) == (2, 8, 1, 128)


def test_megatron_moe_flags():
    """The flags of a shared-expert, dense-leading, sigmoid-routed layout, and a dense one's unchanged."""
    sweep, row = moe_case(8, "megatron")
    args, _ = megatron_args(layout_record(row, sweep))
    line = " ".join(args)
    assert "--num-experts 64 --moe-router-topk 6 --moe-ffn-hidden-size 1408" in line
    assert "--moe-shared-expert-intermediate-size 2816" in line and "--moe-layer-freq ([0]*1+[1]*26)" in line
    assert "--expert-model-parallel-size 8 --expert-tensor-parallel-size 2" in line
    assert "--moe-router-score-function sigmoid" in line and "--recompute-modules mlp moe" in line
    assert "--context-parallel-size" not in line
    sweep, row = moe_case(10, "megatron")  # top-1 softmax needs the softmax before the top-k
    assert "--moe-router-pre-softmax" in megatron_args(layout_record(row, sweep))[0]
    sweep, row = moe_case(13, "megatron")  # dense, cp 4: no MoE flag, and cp needs one device connection
    rec = layout_record(row, sweep)
    args = megatron_args(rec)[0]
    assert args[args.index("--context-parallel-size") + 1] == "4" and not any("moe" in a for a in args)
    assert "experts" not in rec and megatron_env(rec | {"sharding": "zero1"})[0] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def titan_cli_moe_cases() -> list[dict[str, Any]]:
    """torchtitan 0.3's cases of the MoE and cp exports, with the model's config function where it
    ships one (else qwen3_moe_debug for an MoE, llama3_debugmodel for a dense model), and of the
    workload commands of two cp/ep layouts."""
    cases = []
    for i in range(len(MOE_LAYOUTS)):
        sweep, row = moe_case(i, "torchtitan")
        rec = layout_record(row, sweep)
        module, config = ("qwen3", "qwen3_moe_debug") if sweep.model.is_moe else ("llama3", "llama3_debugmodel")
        named = torchtitan_model(rec, version_02=False)[0]
        module, config = named.get("module", module), named.get("config", config)
        cases.append({"argv": torchtitan_cli_args(rec)[0], "world": WORLD, "module": module, "config": config})
    for i in (1, 12):
        sweep, row = moe_case(i, "torchtitan")
        lay = Layout(**{k: row[k] for k in KNOBS})
        argv = render_command(sweep.workload.command, sweep, lay, "torchtitan")[1:]
        cases.append({"argv": argv, "world": WORLD, "module": "qwen3", "config": "qwen3_moe_debug"})
    return cases


@pytest.fixture(scope="module")
def titan_cli_moe(titan_cli_answers) -> list[dict[str, Any]]:
    """torchtitan 0.3's answers to `titan_cli_moe_cases`, in order."""
    return titan_cli_answers[1]


@pytest.mark.slow
def test_torchtitan_cli_moe_and_cp_exports_are_accepted(titan_cli_moe):
    for i, name in enumerate(MOE_IDS):
        got = titan_cli_moe[i]
        assert got["ok"], f"{name}: {got['error']}"
        sweep, row = moe_case(i, "torchtitan")
        rec = layout_record(row, sweep)
        assert (got["tp"], got["pp"], got["cp"], got["ep"]) == (rec["tp"], rec["pp"], rec["cp"], rec["ep"]), name
        assert got["dp_replicate"] * got["dp_shard"] == rec["dp"], name
        # the experts' ranks come out of dp_shard*cp*tp
        assert (got["dp_shard"] * rec["cp"] * rec["tp"]) % rec["ep"] == 0, name
        assert (got["spmd_backend"] == "partial_dtensor") == (rec["cp"] > 1), name
    for got in titan_cli_moe[len(MOE_IDS) :]:  # the workload's {flags} of two cp/ep layouts
        assert got["ok"], got["error"]
        assert got["cp"] == 2


def test_torchtitan_moe_model_and_notes():
    """A preset torchtitan ships is named; one it does not is a note; etp it cannot run is a note."""
    sweep, row = moe_case(1, "torchtitan")
    text = to_torchtitan_cli(row, sweep)
    assert "--module qwen3 --config qwen3_30b_a3b" in text
    sweep, row = moe_case(7, "torchtitan")
    text = to_torchtitan_cli(row, sweep)
    assert "torchtitan ships no such config function" in text and "mixtral-8x7b" in text
    sweep, row = moe_case(2, "megatron")  # etp = tp = 2 with ep = 4: 0.3 has no expert tensor parallel
    _, notes = torchtitan_cli_args(layout_record(row, sweep))
    assert any(n.startswith("etp=2: torchtitan 0.3 has no expert tensor parallel degree") for n in notes)


def titan_toml_moe_cases(out: Path) -> list[dict[str, Any]]:
    """torchtitan 0.2.2's cases of the MoE and cp TOML exports, written under `out`."""
    cases = []
    for i in range(len(MOE_LAYOUTS)):
        sweep, row = moe_case(i, "torchtitan-0.2")
        path = out / f"moe-{i}.toml"
        path.write_text(to_torchtitan(row, sweep))
        cases.append({"toml": str(path), "world": WORLD})
    return cases


@pytest.fixture(scope="module")
def titan_toml_moe(titan_toml_answers) -> list[dict[str, Any]]:
    """torchtitan 0.2.2's answers to `titan_toml_moe_cases`, in order."""
    return titan_toml_answers[1]


@pytest.mark.slow
def test_torchtitan_toml_moe_and_cp_exports_are_accepted(titan_toml_moe):
    for i, name in enumerate(MOE_IDS):
        got = titan_toml_moe[i]
        sweep, row = moe_case(i, "torchtitan-0.2")
        rec = layout_record(row, sweep)
        text = to_torchtitan(row, sweep)
        named = torchtitan_model(rec, version_02=True)[0]
        if rec["pp"] > 1 and named:  # 0.2.2's qwen3 and gpt_oss have no pipelining: the export says so
            assert not got["ok"] and "does not support pipelining" in got["error"], name
            assert f"pp={rec['pp']}: torchtitan 0.2 has no pipelining for {named['name']}" in text, name
            continue
        assert got["ok"], f"{name}: {got['error']}"
        assert (got["cp"], got["ep"]) == (rec["cp"], rec["ep"]), name
        assert got["etp"] == (rec["etp"] if sweep.model.is_moe else 1), name
        assert got["dp_replicate"] * got["dp_shard"] == rec["dp"], name
        assert got["model"] == ([named["name"], named["flavor"]] if named else ["llama3", "debugmodel"]), name


def test_torchtitan_workload_runs_etp_one_under_ep_and_tp_without():
    """torchtitan 0.3 has no expert tensor-parallel degree: the plan of its workload refuses the others."""
    sweep = moe_sweep("qwen3", "torchtitan")
    assert Layout(tp=2, sequence_parallel=True, ep=4, etp=1).rejection(sweep) is None
    assert Layout(tp=2, sequence_parallel=True, ep=1).rejection(sweep) is None  # etp follows tp
    for lay in (Layout(tp=2, sequence_parallel=True, ep=4), Layout(tp=2, ep=1, etp=1)):
        why = lay.rejection(sweep)
        assert why is not None and why.code == PlanReason.EXPERTS_NOT_IN_WORKLOAD
        assert "runs etp = 1 with ep > 1 and etp = tp without" in why.message

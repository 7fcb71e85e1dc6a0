"""Every registered trainer keeps the common contract, and the registry is what the sweep file allows.

A new trainer class is held to all of this by being in `TRAINERS`: it parses its memory options,
has a recipe the memory model can estimate with, renders its flags, environment and exports,
reads a log, and says how many processes a launcher starts per node.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from sweeper.cli.best import Format
from sweeper.errors import SpecError
from sweeper.estimate.memory import estimate
from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.results.identity import sweep_identity
from sweeper.spec.loader import parse_sweep
from sweeper.spec.memory_options import MemoryOptions
from sweeper.spec.traits import TimeTraits
from sweeper.trainers import EXPORTERS, RECIPES, TRAINERS, memory_record, recipe_of
from sweeper.trainers.base import ParsedLog, Recipe, Trainer
from sweeper.trainers.export import layout_record
from tests.conftest import make_sweep

TINY = {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 1000}
MEGATRON_LOG = (
    " [2025-04-13 23:41:12] iteration        1/      10 | elapsed time per iteration (ms): 1200.0 | "
    "throughput per GPU (TFLOP/s/GPU): 100.0 | lm loss: 1.0E+01 |\n"
    " [2025-04-13 23:41:13] iteration        2/      10 | elapsed time per iteration (ms): 1100.0 | "
    "throughput per GPU (TFLOP/s/GPU): 110.0 | lm loss: 9.0E+00 |\n"
)
TITAN_LOG = (
    "step:  1  loss:  8.1661  grad_norm:  3.6855  memory:  2.47GiB(3.12%)  tps: 3,502  tflops: 1.90  mfu: 0.19%\n"
    "step:  2  loss:  6.1098  grad_norm:  4.6416  memory:  2.49GiB(3.14%)  tps: 177,138  tflops: 96.17  mfu: 9.72%\n"
)

# src/nanotron/logging.py LoggerWriter.add_scalars_from_list at c2528430 (tests/trainers/test_nanotron.py)
NANOTRON_LOG = (
    "11/24/2026 19:00:01 [INFO|DP=0|PP=1|TP=0]: iteration: 1 / 10 | consumed_tokens: 3.15M | "
    "elapsed_time_per_iteration_ms: 4.57K | tokens_per_sec: 689K | lm_loss: 11.9 | model_tflops_per_gpu: 98.4\n"
    "11/24/2026 19:00:02 [INFO|DP=0|PP=1|TP=0]: iteration: 2 / 10 | consumed_tokens: 6.29M | "
    "elapsed_time_per_iteration_ms: 1.23K | tokens_per_sec: 2.55M | lm_loss: 10.9 | model_tflops_per_gpu: 389\n"
)


def sweep_of(kind: str, **memory: Any):
    command = kind not in TRAINERS or TRAINERS[kind].runs_command
    workload = {"kind": kind, "command": "run {flags}"} if command else {"kind": kind}
    return make_sweep(
        model=TINY,
        seq_len=128,
        global_batch_size=16,
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm"},
        space={"tp": [1, 2], "pp": [1, 2]},
        workload=workload,
        memory=memory,
    )


def test_registry_keys_are_the_allowed_workload_kinds():
    assert {"builtin", "megatron", "torchtitan", "nanotron", "deepspeed", "command"} <= set(TRAINERS)
    assert next(iter(TRAINERS)) == "builtin" and sweep_of("builtin").workload.kind == "builtin"  # the default
    with pytest.raises(SpecError) as e:
        sweep_of("nope")
    allowed = re.search(r"allowed: ([a-z, ]+)", str(e.value))
    assert allowed is not None and allowed.group(1).split(", ") == list(TRAINERS)
    for kind, trainer in TRAINERS.items():
        assert trainer.kind == kind and sweep_of(kind).trainer is trainer


def test_recipes_are_the_trainers_and_explicit():
    assert {"builtin", "megatron", "torchtitan", "deepspeed", "explicit"} <= set(RECIPES)
    assert {t.recipe.name for t in TRAINERS.values()} <= set(RECIPES)
    for name, recipe in RECIPES.items():
        assert recipe.name == name
        assert issubclass(recipe.options, MemoryOptions) and recipe.options.model_fields["recipe"].default == name


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_trainer_contract(kind: str):
    trainer = TRAINERS[kind]
    assert isinstance(trainer, Trainer) and isinstance(trainer.recipe, Recipe) and isinstance(trainer.time, TimeTraits)
    assert RECIPES[trainer.recipe.name].name == trainer.recipe.name
    # memory.recipe defaults to the trainer's recipe, whose options the sweep file parses
    s = sweep_of(kind)
    assert s.memory.recipe == trainer.recipe.name and isinstance(s.memory, trainer.recipe.options)
    assert recipe_of(s).name == trainer.recipe.name
    # the memory model estimates with it: positive, finite, every term
    cols = Layout(tp=2, pp=2, sharding="zero1").columns(s)
    e = estimate(cols, s)
    assert np.all(np.isfinite(e.total)) and float(e.total[0]) > float(e.overhead[0]) > 0
    assert all(isinstance(p, str) for p in trainer.recipe.summary(s.memory))
    # attention kernels: a non-empty subset of the knob's, and the plan's rule follows them
    assert trainer.attention and trainer.attention <= set(KNOBS["attention"].choices)
    plan = make_plan(s)
    assert plan.counts().get("candidate", 0) > 0
    # flags, environment and exports of a winner
    rec = layout_record(Layout(tp=2, pp=2).resolve(s).as_fields() | {"trial_number": 1, "mfu": 0.5}, s)
    flags = trainer.flags(rec, 10)
    assert all(isinstance(f, str) for f in flags)
    assert trainer.order_argv(["run", *flags], flags)[0] == "run"
    needed, reasons = trainer.env(rec)
    assert len(needed) == len(reasons)
    for fmt, export in trainer.exports.items():
        assert EXPORTERS[fmt] is export and isinstance(export(rec, s), str)
        assert Format(fmt).value == fmt  # a `sweep best --format` choice
    # the log it reads
    if trainer.runs_command:
        parsed = trainer.parse_log(MEGATRON_LOG + TITAN_LOG + NANOTRON_LOG, s)
        assert isinstance(parsed, ParsedLog) and len(parsed.step_times_s) == 2 and len(parsed.losses) == 2


def test_flags_only_where_the_trainer_has_them():
    s = sweep_of("megatron")
    rec = layout_record(Layout(tp=2).resolve(s).as_fields(), s)
    assert "--tensor-model-parallel-size" in TRAINERS["megatron"].flags(rec, 10)
    assert "--parallelism.tensor_parallel_degree" in TRAINERS["torchtitan"].flags(rec, 10)
    assert TRAINERS["command"].flags(rec, 10) == TRAINERS["deepspeed"].flags(rec, 10) == []
    assert TRAINERS["megatron"].env(rec)[0] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_an_option_of_another_recipe_names_the_recipes_that_take_it():
    options = {n for r in RECIPES.values() for n in r.options.model_fields} - set(MemoryOptions.model_fields)
    assert options == {"distributed_optimizer", "grad_accum_dtype", "zero_stage", "compiled_loss", "bytes"}
    with pytest.raises(
        SpecError,
        match=r"memory\.grad_accum_dtype applies to recipes megatron and deepspeed only, "
        r"not 'torchtitan'",
    ):
        sweep_of("builtin", recipe="torchtitan", grad_accum_dtype="bf16")
    # left out, memory.recipe is the workload's trainer's: its options are the ones accepted
    assert sweep_of("deepspeed", zero_stage=2).memory.recipe == "deepspeed"
    with pytest.raises(SpecError, match=r"memory\.zero_stage applies to recipe deepspeed only, not 'megatron'"):
        sweep_of("megatron", zero_stage=2)


# sweep_identity before the memory options were split by recipe (commit 3b0d23e): results folders
# recorded then must keep their identity
BASE = (
    "name: idt\nmodel: llama-7b\nseq_len: 2048\nglobal_batch_size: 64\n"
    "cluster: {nodes: 1, gpus_per_node: 8, gpu: a100-80gb}\n"
)
IDENTITIES = {
    "": "b8066219141b7590",
    "memory: {recipe: megatron, distributed_optimizer: true}\n": "1304be53b4a51b32",
    "memory: {recipe: explicit, bytes: {params: 2, grads: 4, optimizer: 8, sharded: [optimizer]}}\n": "347b64198b114eae",
    "workload: {kind: torchtitan, command: 'torchrun train.py {flags}'}\n": "2b1bec189c256f5c",
    "memory: {recipe: deepspeed, zero_stage: 2, headroom: 0.1}\n": "e0c4490351988ccd",
}


@pytest.mark.parametrize("extra", list(IDENTITIES))
def test_sweep_identity_unchanged_by_the_recipe_split(extra: str):
    s = parse_sweep(BASE + extra)
    assert sweep_identity(s) == IDENTITIES[extra]
    assert set(memory_record(s.memory)) >= set(type(s.memory).model_fields)

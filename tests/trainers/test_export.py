"""Exports of a winning layout parse back to the right values: TOML for torchtitan, argparse for Megatron-LM."""

from __future__ import annotations

import argparse
import json
import shlex
import tomllib
from typing import Any

import pytest
import yaml

from sweeper.knobs import KNOBS
from sweeper.results.rows import ResultsStore
from sweeper.trainers.export import (
    to_json,
    to_megatron,
    to_torchtitan,
    to_torchtitan_cli,
    to_yaml,
)
from tests.conftest import make_sweep, sweep_cli

SWEEP = make_sweep()  # llama-13b (40 layers), seq 2048, global batch 2048, 64 A100s, bf16


def row(**knobs: Any) -> dict[str, Any]:
    """A results row of an ok trial on 64 GPUs with the given knobs (others at their defaults)."""
    values = {k: knob.default for k, knob in KNOBS.items()} | knobs
    values["etp"] = values["etp"] or values["tp"]  # results hold etp resolved (it follows tp)
    dp = 64 // (values["tp"] * values["pp"])
    return {
        "trial_number": 3,
        "status": "ok",
        "mfu": 0.52,
        **values,
        "dp": dp,
        "grad_accum": 2048 // (values["micro_batch_size"] * dp),
        "num_devices": 64,
    }


def megatron_parser() -> argparse.ArgumentParser:
    """An argparse parser with the Megatron-LM flags the exporter may emit (types as in arguments.py)."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in (
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--micro-batch-size",
        "--global-batch-size",
        "--seq-length",
        "--num-layers-per-virtual-pipeline-stage",
        "--recompute-num-layers",
    ):
        p.add_argument(flag, type=int)
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--recompute-modules", nargs="*")
    p.add_argument("--transformer-impl", choices=["local", "transformer_engine"])
    p.add_argument("--attention-backend", choices=["flash", "fused", "unfused", "local", "auto"])
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--data-parallel-sharding-strategy")
    p.add_argument("--ckpt-format")
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"])
    for flag in (
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--use-megatron-fsdp",
        "--bf16",
        "--no-masked-softmax-fusion",
    ):
        p.add_argument(flag, action="store_true")
    return p


def parse_megatron(text: str) -> argparse.Namespace:
    """Parse the shell fragment as a shell would (comments dropped, line continuations joined)."""
    return megatron_parser().parse_args(shlex.split(text.replace("\\\n", " "), comments=True))


def test_torchtitan_toml_parses_to_the_layout():
    doc = tomllib.loads(
        to_torchtitan(
            row(
                tp=4,
                pp=2,
                micro_batch_size=2,
                sequence_parallel=True,
                activation_checkpointing="selective",
                compile=True,
            ),
            SWEEP,
        )
    )
    par = doc["parallelism"]
    assert par["tensor_parallel_degree"] == 4 and par["pipeline_parallel_degree"] == 2
    # DDP with tp/pp > 1 is refused by torchtitan: the export shards over dp instead, and says so
    assert par["data_parallel_replicate_degree"] == 1 and par["data_parallel_shard_degree"] == 8
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["enable_async_tensor_parallel"] is False
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert par["module_fqns_per_model_part"][0][:2] == ["tok_embeddings", "layers.0"]
    assert par["module_fqns_per_model_part"][1][-3:] == ["layers.39", "norm", "output"]
    # with pipelining, local_batch_size holds every micro-batch of a step: 2 * 128
    assert doc["training"] == {
        "local_batch_size": 256,
        "global_batch_size": 2048,
        "seq_len": 2048,
        "mixed_precision_param": "bfloat16",
    }
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert doc["compile"] == {"enable": True, "components": ["model", "loss"]}
    assert "model" not in doc


def test_torchtitan_fsdp_interleaved_float8_and_notes():
    text = to_torchtitan(
        row(
            tp=2,
            pp=4,
            sharding="fsdp",
            pp_schedule="interleaved",
            virtual_stages=2,
            activation_checkpointing="ffn",
            float8=True,
        ),
        SWEEP,
    )
    doc = tomllib.loads(text)
    par = doc["parallelism"]
    assert par["data_parallel_shard_degree"] == 8 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = par["module_fqns_per_model_part"]  # 8 stages of 5 layers, embedding first, output last
    assert len(parts) == 8 and [sum(n.startswith("layers.") for n in p) for p in parts] == [5] * 8
    assert doc["activation_checkpoint"]["mode"] == "selective"
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    comments = [line for line in text.splitlines() if line.startswith("#")]
    for named in ("activation_checkpointing=ffn", "sequence_parallel=false", "attention=flash2", "rmsnorm=eager"):
        assert any(named in c for c in comments), named


def test_torchtitan_pp1_accumulates_and_zero1_is_named():
    text = to_torchtitan(row(tp=8, micro_batch_size=4, sharding="zero1", sequence_parallel=True), SWEEP)
    doc = tomllib.loads(text)
    assert doc["training"]["local_batch_size"] == 4  # torchtitan accumulates up to the global batch itself
    assert doc["activation_checkpoint"] == {"mode": "none"}
    assert "# no torchtitan option: sharding=zero1" in text


def test_megatron_flags_parse_back():
    args = parse_megatron(
        to_megatron(
            row(
                tp=4,
                pp=2,
                micro_batch_size=2,
                sequence_parallel=True,
                activation_checkpointing="full",
                sharding="zero1",
            ),
            SWEEP,
        )
    )
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (4, 2)
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (2, 2048, 2048)
    assert args.sequence_parallel and args.use_distributed_optimizer and args.bf16
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == ("full", "uniform", 1)
    assert args.attention_backend == "flash" and args.transformer_impl == "transformer_engine"
    assert args.num_layers_per_virtual_pipeline_stage is None and not args.use_megatron_fsdp


def test_megatron_interleaved_selective_eager_fsdp_float8():
    text = to_megatron(
        row(
            pp=4,
            pp_schedule="interleaved",
            virtual_stages=5,
            activation_checkpointing="selective",
            attention="eager",
            sharding="fsdp",
            float8=True,
            compile=True,
        ),
        SWEEP,
    )
    args = parse_megatron(text)
    assert args.num_layers_per_virtual_pipeline_stage == 2  # 40 layers / (4 stages * 5 chunks)
    assert args.ckpt_format == "fsdp_dtensor"
    assert args.recompute_granularity == "selective" and args.recompute_method is None
    assert args.attention_backend == "unfused" and args.no_masked_softmax_fusion
    assert args.use_megatron_fsdp and args.data_parallel_sharding_strategy == "optim_grads_params"
    assert args.fp8_format == "hybrid" and not args.sequence_parallel
    assert "# no Megatron-LM flag: compile=true" in text and "# no Megatron-LM flag: rmsnorm=eager" in text


def test_megatron_ffn_checkpointing_and_gpipe_named():
    text = to_megatron(row(pp=2, pp_schedule="gpipe", activation_checkpointing="ffn", attention="cudnn"), SWEEP)
    args = parse_megatron(text)
    assert args.recompute_granularity == "selective" and args.recompute_modules == ["mlp"]
    assert args.attention_backend == "fused"
    assert "pp_schedule=gpipe" in text


def test_torchtitan_cli_overrides_are_tyro_style():
    text = to_torchtitan_cli(
        row(
            tp=2,
            pp=4,
            pp_schedule="interleaved",
            virtual_stages=2,
            compile=False,
            activation_checkpointing="full",
            float8=True,
        ),
        SWEEP,
    )
    assert "# torchtitan 0.3.0 overrides" in text
    argv = shlex.split(text.replace("\\\n", " "), comments=True)
    assert "--compile.no-enable" in argv and "--parallelism.no-enable_sequence_parallel" in argv
    assert not any(a.endswith(("=false", "=true")) for a in argv)
    assert argv[-1] == "activation-checkpoint:full" and "--training.disable_cuda_graphs" in argv
    i = argv.index("--parallelism.module_fqns_per_model_part")
    parts = argv[i + 1 : i + 9]  # 8 stages of 5 layers; 0.3 calls the output projection lm_head
    assert parts[0] == "tok_embeddings,layers.0,layers.1,layers.2,layers.3,layers.4"
    assert parts[-1] == "layers.35,layers.36,layers.37,layers.38,layers.39,norm,lm_head"
    assert argv[argv.index("--parallelism.data_parallel_replicate_degree") + 1] == "8"  # 0.3: no 1-D-only DDP
    assert argv[argv.index("--parallelism.data_parallel_shard_degree") + 1] == "1"
    assert "# no torchtitan option: float8=true: torchtitan 0.3 has no command-line switch" in text


def test_uneven_stages_in_both_trainers():
    s30 = make_sweep(model={"layers": 30, "hidden": 5120, "heads": 40, "ffn": 13824, "vocab": 32000})
    r = row(pp=4, micro_batch_size=1)
    mg = to_megatron(r, s30)
    args = shlex.split(mg.replace("\\\n", " "), comments=True)
    # split_layers(30, 4) = 7, 8, 8, 7: the embedding on the first stage, the loss on the last
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*7|t*8|t*8|t*7,L"
    assert "uneven pipeline split 7/8/8/7" in mg
    parts = tomllib.loads(to_torchtitan(r, s30))["parallelism"]["module_fqns_per_model_part"]
    assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [7, 8, 8, 7]


@pytest.mark.parametrize("dump, load", [(to_json, json.loads), (to_yaml, yaml.safe_load)])
def test_data_formats_round_trip(dump, load):
    r = row(tp=2, pp=2, sequence_parallel=True, attention="cudnn")
    doc = load(dump(r, SWEEP))
    assert {k: doc[k] for k in KNOBS} == {k: r[k] for k in KNOBS}
    assert (doc["dp"], doc["grad_accum"], doc["seq_len"], doc["global_batch_size"]) == (16, 128, 2048, 2048)
    assert doc["mfu"] == 0.52 and doc["trial_number"] == 3


def test_best_exports_the_winner_from_a_results_folder(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": "llama-13b",
                "seq_len": 2048,
                "global_batch_size": 2048,
                "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
                "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4]},
                "results_dir": str(tmp_path / "results"),
            }
        )
    )
    store = ResultsStore(tmp_path / "results" / "t")
    store.ensure()
    store.write_row(row(tp=2, pp=1) | {"trial_number": 0, "mfu": 0.40})
    store.write_row(row(tp=4, pp=2) | {"trial_number": 1, "mfu": 0.55})
    store.write_row(row(tp=8, pp=4) | {"trial_number": 2, "status": "oom", "mfu": None})
    tt = sweep_cli("best", str(spec), "--format", "torchtitan", cwd=tmp_path)
    assert tt.returncode == 0, tt.stderr
    assert tomllib.loads(tt.stdout)["parallelism"]["tensor_parallel_degree"] == 4
    cli = sweep_cli("best", str(spec), "--format", "torchtitan-cli", cwd=tmp_path)
    assert cli.returncode == 0 and "--parallelism.tensor_parallel_degree 4" in cli.stdout
    mg = sweep_cli("best", str(spec), "--format", "megatron", cwd=tmp_path)
    assert parse_megatron(mg.stdout).pipeline_model_parallel_size == 2
    js = json.loads(sweep_cli("best", str(spec), "--format", "json", cwd=tmp_path).stdout)
    assert js["best"]["trial_number"] == 1 and js["layout"]["tp"] == 4
    assert yaml.safe_load(sweep_cli("best", str(spec), "--format", "yaml", cwd=tmp_path).stdout)["pp"] == 2


def test_best_export_without_a_winner_is_one_line_error(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": "llama-13b",
                "seq_len": 2048,
                "global_batch_size": 2048,
                "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
                "space": {"tp": [1, 2]},
                "results_dir": str(tmp_path / "results"),
            }
        )
    )
    store = ResultsStore(tmp_path / "results" / "t")
    store.ensure()
    store.write_row(row(tp=2) | {"trial_number": 0, "status": "oom", "mfu": None})
    r = sweep_cli("best", str(spec), "--format", "megatron", cwd=tmp_path)
    assert r.returncode == 1 and "no successful trial" in r.stderr and "Traceback" not in r.stderr  # 1: no success

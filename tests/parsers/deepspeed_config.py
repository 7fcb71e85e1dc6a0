"""Run DeepSpeed's own config class on exported ds_config.json files, one case per JSON line.

usage: python deepspeed_config.py < cases.jsonl
Each case: {"path": ds_config.json, "dp": data-parallel degree}. DeepSpeedConfig (deepspeed/runtime/
config.py) reads the file as a run does (hjson, duplicate keys refused), checks train_batch_size =
micro-batch x accumulation x the data-parallel size, which it asks of the `mpu` a Megatron-style
script hands it (`get_data_parallel_world_size`), and builds its ZeRO, precision, checkpointing and
pipeline settings; the answer is what it built. It asks the rank of torch.distributed first, so a
one-process gloo group is started (the `mpu` then says the sweep's dp). The one stand-in: DeepSpeed's
shared-memory collective op, which its CPU backend would compile at start (minutes, a C++
compiler), is taken as absent, as on a platform without it (comm/torch.py: plain gloo then).
"""

# ruff: noqa: E402  (warnings and logging are silenced before DeepSpeed's imports, which emit them)

import json
import logging
import os
import sys
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
os.environ.update(
    {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
)

import importlib

import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig

# the module, by its name: the attribute deepspeed.comm.torch is the torch package it imports
backend = importlib.import_module("deepspeed.comm.torch")

backend.build_shm_op = lambda: None  # no compiled op: gloo's own collectives

deepspeed.init_distributed(dist_backend="gloo", verbose=False)


class DataParallel:
    """The one question DeepSpeedConfig asks of a script's model-parallel unit."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


for line in sys.stdin:
    case = json.loads(line)
    try:
        cfg = DeepSpeedConfig(case["path"], mpu=DataParallel(case["dp"]))
        out = {
            "ok": True,
            "world_size": cfg.world_size,
            "train_batch_size": cfg.train_batch_size,
            "micro_batch": cfg.train_micro_batch_size_per_gpu,
            "grad_accum": cfg.gradient_accumulation_steps,
            "zero_stage": int(cfg.zero_optimization_stage),
            "reduce_bucket_size": cfg.zero_config.reduce_bucket_size,
            "prefetch_bucket_size": cfg.zero_config.prefetch_bucket_size,
            "bf16": cfg.bfloat16_config.enabled,
            "fp16": cfg.float16_config.enabled,
            "grad_accum_dtype": cfg.grad_accum_dtype,
            "checkpointing": "activation_checkpointing" in cfg._param_dict,
            "partition_activations": cfg.activation_checkpointing_config.partition_activations,
            "pipeline": cfg.pipeline,
        }
    except Exception as e:  # a refused config is the answer, whatever DeepSpeed raises
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out, default=str), flush=True)

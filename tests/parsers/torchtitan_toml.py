"""Run torchtitan 0.2's own ConfigManager on export TOML files, one case per JSON line.

usage: PYTHONPATH=<torchtitan 0.2.x> python torchtitan_toml.py < cases.jsonl
Each case: {"toml": path, "world": N}. ConfigManager.parse_args(["--job.config_file", path])
loads and type-checks the TOML; ParallelDims checks the degrees; DDP is accepted only where
models/llama3/infra/parallelize.py accepts it (the dp_replicate mesh is the whole world); the
expert mesh needs ep*etp to divide dp_shard*cp*tp (build_mesh's efsdp); a model name and flavor
other than the default must be in that model's train spec.
"""

# ruff: noqa: E402  (warnings and logging are silenced before the trainer's imports, which emit them)

import json
import sys
import warnings

warnings.filterwarnings("ignore")
import logging

logging.disable(logging.WARNING)

from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    get_schedule_class,
)
from torchtitan.config.manager import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims

for line in sys.stdin:
    case = json.loads(line)
    try:
        cfg = ConfigManager().parse_args(["--job.config_file", case["toml"]])
        par = cfg.parallelism
        dims = ParallelDims(
            dp_replicate=par.data_parallel_replicate_degree,
            dp_shard=par.data_parallel_shard_degree,
            cp=par.context_parallel_degree,
            tp=par.tensor_parallel_degree,
            pp=par.pipeline_parallel_degree,
            ep=par.expert_parallel_degree,
            etp=par.expert_tensor_parallel_degree,
            world_size=case["world"],
        )
        if (dims.dp_shard * dims.cp * dims.tp) % (dims.ep * dims.etp):
            raise ValueError(
                f"ep*etp={dims.ep}*{dims.etp} does not divide dp_shard*cp*tp: build_mesh has no efsdp axis"
            )
        if cfg.model.name != "llama3":
            from torchtitan.protocols.train_spec import get_train_spec

            spec = get_train_spec(cfg.model.name)
            if cfg.model.flavor not in spec.model_args:
                raise ValueError(f"torchtitan has no {cfg.model.name} flavor {cfg.model.flavor}")
            if par.pipeline_parallel_degree > 1 and not spec.pipelining_fn:  # train.py's check
                raise RuntimeError(f"Pipeline Parallel is enabled but {cfg.model.name} does not support pipelining")
        if dims.dp_replicate_enabled and not dims.fsdp_enabled and dims.world_size != dims.dp_replicate:
            raise RuntimeError("DDP has not supported > 1D parallelism")
        parts = par.module_fqns_per_model_part
        if dims.pp > 1:
            single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
            if len(parts) % dims.pp or single != (len(parts) == dims.pp):
                raise ValueError(f"{len(parts)} stages for pp={dims.pp} and schedule {par.pipeline_parallel_schedule}")
        out = {
            "ok": True,
            "dp_replicate": dims.dp_replicate,
            "dp_shard": dims.dp_shard,
            "parts": parts,
            "ac": cfg.activation_checkpoint.mode,
            "converters": cfg.model.converters,
            "float8": getattr(getattr(cfg, "quantize", None), "linear", None) is not None,
            "cp": dims.cp,
            "ep": dims.ep,
            "etp": dims.etp,
            "model": [cfg.model.name, cfg.model.flavor],
        }
    except (AssertionError, ValueError, RuntimeError, SystemExit, TypeError) as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)

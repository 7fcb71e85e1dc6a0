"""Run torchtitan 0.3's own ConfigManager on export overrides, one case per JSON line.

usage: python torchtitan_cli.py < cases.jsonl   (torchtitan 0.3.x importable)
Each case: {"argv": [...], "world": N, "module": M, "config": F}. The overrides go after `--module M
--config F` (default llama3 and llama3_debugmodel) as a user's command line would; then ParallelDims
(its own degree checks), the expert mesh build_mesh unflattens (efsdp = dp_shard*cp*tp / ep ranks)
and, with pipelining, the stage-to-rank mapping torchtitan builds from module_fqns_per_model_part.
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
from torchtitan.distributed.pipeline_parallel import (
    _get_pp_rank_to_stage_indices_mapping,
)

for line in sys.stdin:
    case = json.loads(line)
    try:
        module, config = case.get("module", "llama3"), case.get("config", "llama3_debugmodel")
        cfg = ConfigManager().parse_args(["--module", module, "--config", config, *case["argv"]])
        par = cfg.parallelism
        dims = ParallelDims.from_config(par, case["world"])
        if (dims.dp_shard * dims.cp * dims.tp) % dims.ep:
            raise ValueError(f"ep={dims.ep} does not divide dp_shard*cp*tp: build_mesh has no efsdp axis for it")
        parts = par.module_fqns_per_model_part
        if dims.pp > 1:
            single = issubclass(get_schedule_class(par.pipeline_parallel_schedule), PipelineScheduleSingle)
            per_rank = len(parts) // dims.pp
            if single != (per_rank == 1) or len(parts) % dims.pp:
                raise ValueError(f"{len(parts)} stages for pp={dims.pp} and schedule {par.pipeline_parallel_schedule}")
            for rank in range(dims.pp):
                _get_pp_rank_to_stage_indices_mapping(rank, dims.pp, par.pipeline_parallel_schedule, len(parts))
        out = {
            "ok": True,
            "dp_replicate": dims.dp_replicate,
            "dp_shard": dims.dp_shard,
            "tp": dims.tp,
            "pp": dims.pp,
            "parts": parts,
            "ac": type(cfg.activation_checkpoint).__qualname__,
            "compile": cfg.compile.enable,
            "sp": par.enable_sequence_parallel,
            "local_batch_size": cfg.training.local_batch_size,
            "cp": dims.cp,
            "ep": dims.ep,
            "spmd_backend": par.spmd_backend,
        }
    except (AssertionError, ValueError, SystemExit, TypeError) as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)

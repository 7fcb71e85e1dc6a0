"""Run Megatron-LM's own argument parsing and validation on export flags, one case per JSON line.

usage: PYTHONPATH=<Megatron-LM tree> python megatron_validate.py < cases.jsonl
Each case: {"argv": [...], "env": {name: value or null}, "world": N, "config": bool}. Prints one
JSON line per case: {"ok": true, "dp": .., "vpp": ..} or {"ok": false, "error": "..."}. Megatron-LM's
`parse_args` (add_megatron_arguments, RANK/WORLD_SIZE from the environment) and `validate_args`
do the work; with "config", `core_transformer_config_from_args` then builds the TransformerConfig
and ModelParallelConfig, whose __post_init__ checks the MoE and context-parallel settings. The
stand-ins are the GPU this machine lacks, read by validate_args from torch.cuda: FAKE_GPU_ARCH
(9, Hopper: the GPUs of the paper's sweeps) and its compute capability (--moe-grouped-gemm asks
it), and Transformer Engine, which TransformerConfig asks for rope fusion (turned off) and its
version (taken as recent).
"""

# ruff: noqa: E402  (warnings and logging are silenced before the trainer's imports, which emit them)

import contextlib
import io
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
FAKE_GPU_ARCH = 9

import torch
from megatron.core.transformer import transformer_config
from megatron.core.transformer.pipeline_parallel_layer_layout import (
    PipelineParallelLayerLayout,
)
from megatron.training import arguments
from megatron.training.argument_utils import ArgumentGroupFactory

# parse_args builds its parser anew each call, and each ArgumentGroupFactory reads its dataclass's source
# and parses it to find the fields' docstrings (the help text): the same answer for every case, and most of
# this harness's time (about 0.3 s a case). Read once per class; what is parsed and validated is unchanged.
_docstrings = ArgumentGroupFactory._get_field_docstrings
_read = {}


def _docstrings_once(self, cls):
    if cls not in _read:
        _read[cls] = _docstrings(self, cls)
    return _read[cls]


ArgumentGroupFactory._get_field_docstrings = _docstrings_once

arguments.get_device_arch_version = lambda: FAKE_GPU_ARCH  # the GPU this machine does not have
torch.cuda.get_device_capability = lambda *a, **k: (FAKE_GPU_ARCH, 0)
transformer_config.is_te_min_version = lambda *a, **k: True  # Transformer Engine is not installed here

START_ENV = dict(os.environ)  # each case's environment: this one, then its own "env" (none left by another case)

for line in sys.stdin:
    case = json.loads(line)
    os.environ.clear()
    os.environ.update(START_ENV)
    for name, value in case["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    os.environ.update(RANK="0", WORLD_SIZE=str(case["world"]))
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):  # argparse says why it exits there
            args = arguments.parse_args()
        arguments.validate_args(args)
        if args.pipeline_model_parallel_layout is not None:
            # validate_args leaves the layout's layer count to TransformerConfig; check it the same way
            layout = args.pipeline_model_parallel_layout
            if isinstance(layout, str):
                layout = PipelineParallelLayerLayout(layout, args.pipeline_model_parallel_size)
            layout.validate_layer_layout(args.num_layers, 0)
        if case.get("config"):
            args.apply_rope_fusion = False  # a Transformer Engine kernel (absent here), not a layout setting
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                arguments.core_transformer_config_from_args(args)
            # ModelParallelConfig only warns where expert and tensor parallelism lack sequence parallelism
            for w in said:
                if "sequence parallelism must be used" in str(w.message):
                    raise AssertionError(str(w.message))
        out = {
            "ok": True,
            "dp": args.data_parallel_size,
            "vpp": args.virtual_pipeline_model_parallel_size,
            "ckpt_format": args.ckpt_format,
            "cp": args.context_parallel_size,
            "ep": args.expert_model_parallel_size,
            "etp": args.expert_tensor_parallel_size,
            "experts": args.num_experts,
            "topk": args.moe_router_topk,
            "moe_ffn": args.moe_ffn_hidden_size,
            "shared": args.moe_shared_expert_intermediate_size,
            "layer_freq": args.moe_layer_freq,
            "score": args.moe_router_score_function,
        }
    except (AssertionError, ValueError, SystemExit, TypeError) as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e} {err.getvalue()[-500:]}"}
    print(json.dumps(out), flush=True)

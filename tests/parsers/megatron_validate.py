"""Run Megatron-LM's own argument parsing and validation on export flags, one case per JSON line.

usage: PYTHONPATH=<Megatron-LM tree> python megatron_validate.py < cases.jsonl
Each case: {"argv": [...], "env": {name: value or null}, "world": N}. Prints one JSON line per
case: {"ok": true, "dp": .., "vpp": ..} or {"ok": false, "error": "..."}. Megatron-LM's
`parse_args` (add_megatron_arguments, RANK/WORLD_SIZE from the environment) and `validate_args`
do the work; the one stand-in is the GPU generation, which validate_args reads from
torch.cuda and this machine lacks: FAKE_GPU_ARCH (9, Hopper: the GPUs of the paper's sweeps).
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

from megatron.core.transformer.pipeline_parallel_layer_layout import (
    PipelineParallelLayerLayout,
)
from megatron.training import arguments

arguments.get_device_arch_version = lambda: FAKE_GPU_ARCH  # the GPU this machine does not have

for line in sys.stdin:
    case = json.loads(line)
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
        out = {
            "ok": True,
            "dp": args.data_parallel_size,
            "vpp": args.virtual_pipeline_model_parallel_size,
            "ckpt_format": args.ckpt_format,
        }
    except (AssertionError, ValueError, SystemExit, TypeError) as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e} {err.getvalue()[-500:]}"}
    print(json.dumps(out), flush=True)

"""Stand-in for Megatron-LM's pretrain_gpt.py: prints log lines in Megatron's exact formats.

Formats from NVIDIA/Megatron-LM (main, 2025): megatron/training/training.py training_log()
(the iteration line) and megatron/training/utils.py report_memory() (the memory line). It
reads the flags the sweep passes and sleeps a step time that depends on them, so different
layouts measure differently. It reports steps a thousand times longer than it sleeps (20-40 s,
what 64 A100s take for a 13B model's 2048 sequences of 2048 tokens, so the MFU it yields is
a possible one), which keeps a sweep of it quick. STANDIN_FAIL=oom prints a CUDA OOM traceback
and exits 1.
"""

import argparse
import os
import sys
import time
from datetime import datetime

p = argparse.ArgumentParser()
p.add_argument("--tensor-model-parallel-size", type=int, required=True)
p.add_argument("--pipeline-model-parallel-size", type=int, required=True)
p.add_argument("--micro-batch-size", type=int, required=True)
p.add_argument("--global-batch-size", type=int, required=True)
p.add_argument("--seq-length", type=int, required=True)
p.add_argument("--train-iters", type=int, required=True)
p.add_argument("--log-interval", type=int, required=True)
args, _unknown = p.parse_known_args()

tp, pp, mbs = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.micro_batch_size
REPORTED_PER_SLEPT = 1000
step_s = 0.02 * (1 + 0.3 * (tp - 1) + 0.2 * (pp - 1)) / (1 + 0.2 * (mbs - 1))
print("> building GPT model ...", flush=True)
for it in range(1, args.train_iters + 1):
    if os.environ.get("STANDIN_FAIL") == "oom" and it == 2:
        print(
            "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
            " GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    time.sleep(step_s * (3 if it == 1 else 1))
    ms = step_s * (3 if it == 1 else 1) * REPORTED_PER_SLEPT * 1000
    line = f" [{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {it:8d}/{args.train_iters:8d} |"
    line += f" consumed samples: {it * args.global_batch_size:12d} |"
    line += f" elapsed time per iteration (ms): {ms:.1f} |"
    line += f" throughput per GPU (TFLOP/s/GPU): {123.4:.1f} |"
    line += f" learning rate: {3e-4:.6E} |"
    line += f" global batch size: {args.global_batch_size:5d} |"
    line += f" lm loss: {10.5 - 0.1 * it:.6E} |"
    line += f" loss scale: {1.0:.1f} |"
    line += f" grad norm: {1.234:.3f} |"
    line += f" number of skipped iterations: {0:3d} |"
    line += f" number of nan iterations: {0:3d} |"
    print(line, flush=True)
    if it == 1:
        print(
            f"[Rank 0] (after {it} iterations) memory (MB) | allocated: 20480.5 | max allocated: 40960.25"
            f" | reserved: 45056.0 | max reserved: 45056.0",
            flush=True,
        )

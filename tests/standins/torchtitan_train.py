"""Stand-in for torchtitan's train.py: prints metric lines in torchtitan's exact format.

Format from pytorch/torchtitan (main, 2025) torchtitan/components/metrics.py, the logger line
of MetricsProcessor.log() (colours off): "step: N  loss: L  grad_norm: G  memory: X.XXGiB(P%)
tps: T  tflops: F  mfu: M%". Reads --training.steps and the parallelism degrees it is given.
"""

import sys
import time

# tyro-style options as torchtitan 0.3 takes them: "--section.field VALUE" (or "--section.field=VALUE")
argv = sys.argv[1:]
opts = {}
for i, a in enumerate(argv):
    if a.startswith("--") and "=" in a:
        opts.update([a.removeprefix("--").split("=", 1)])
    elif a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
        opts[a.removeprefix("--")] = argv[i + 1]
steps = int(opts["training.steps"])
tp = int(opts["parallelism.tensor_parallel_degree"])
tps = 50_000 // tp
for step in range(1, steps + 1):
    time.sleep(0.01)
    print(
        f"[rank0]:[titan] 2025-10-30 14:32:58,897 - root - INFO - step: {step:2}  loss: {8.0 - 0.1 * step:7.4f}  "
        f"grad_norm: {1.5:7.4f}  memory: {30.12:5.2f}GiB({31.70:.2f}%)  tps: {round(tps if step > 1 else tps / 3):,}  "
        f"tflops: {123.45:,.2f}  mfu: {12.48:.2f}%",
        flush=True,
    )

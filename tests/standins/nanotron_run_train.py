"""Stand-in for nanotron's run_train.py: reads its --config-file and prints nanotron's log lines.

Formats from huggingface/nanotron at c2528430: src/nanotron/logging.py LoggerWriter
(`iteration: N / M | tag: human_format(value) | ...` over trainer.py train_step_logs' LogItems) and
log_memory (" Memory usage: ...MiB. Peak allocated ...MiB. Peak reserved: ...MiB"). The step time
is 100 ms x batch_accumulation_per_replica, so a test can tell the config it was given.
"""

import sys
import time
from pathlib import Path

import yaml

cfg = yaml.safe_load(Path(sys.argv[sys.argv.index("--config-file") + 1]).read_text())
steps, accum = cfg["tokens"]["train_steps"], cfg["tokens"]["batch_accumulation_per_replica"]
ms = 100 * accum
print(" Memory usage: 1000.00MiB. Peak allocated 2048.00MiB. Peak reserved: 3072.00MiB", flush=True)
for step in range(1, steps + 1):
    time.sleep(0.01)
    elapsed = f"{ms * (3 if step == 1 else 1) / 1000:.3g}K"
    print(
        f"11/24/2026 19:00:0{step % 10} [INFO|DP=0|PP=0|TP=0]: iteration: {step} / {steps} | "
        f"consumed_tokens: 3.15M | elapsed_time_per_iteration_ms: {elapsed} | tokens_per_sec: 689K | "
        f"lm_loss: {11 - 0.1 * step:.3g} | model_tflops_per_gpu: 98.4",
        flush=True,
    )

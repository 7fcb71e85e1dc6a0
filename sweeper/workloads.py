"""External workloads: trials that run Megatron-LM, torchtitan or any command instead of the built-in trainer.

The sweep file says `workload: {kind: megatron | torchtitan | command, command: "..."}`. The
command is a template: `{flags}` expands to the layout as the trainer's own flags, and
`{tp}`, `{pp}`, `{dp}`, `{micro_batch_size}`, `{grad_accum}`, `{global_batch_size}`,
`{seq_len}`, `{steps}`, `{nproc}`, `{nnodes}`, `{node_rank}`, `{master_addr}`, `{master_port}`
and every knob to their values. Locally the command runs once; on SLURM once per node (one
task per node, e.g. `torchrun --nnodes {nnodes} --node-rank {node_rank} ...`). It is split like a shell line but run without a shell, so a value can never inject
a command. Its log is parsed in the trainer's own format, the 10-step protocol applied
(warm-up dropped, the rest averaged), and MFU recomputed with our formula for comparability.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.export import (
    layout_record,
    megatron_args,
    megatron_env,
    torchtitan_cli_args,
)
from sweeper.layout import Layout
from sweeper.process import free_port, kill_group
from sweeper.spec import Sweep
from sweeper.trial import FAILED, OOM, TIMEOUT, TrialResult, summarize, without_run


@dataclass
class ParsedLog:
    """What a trainer's log says about its steps."""

    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    peak_mem_gib: float | None = None
    peak_mem_reserved_gib: float | None = None
    reported_tflops: list[float] = field(default_factory=list)


# megatron/training/training.py, training_log() (Megatron-LM core_r0.12 / main, 2025):
#  " [2025-04-13 23:41:12] iteration       10/    1000 | consumed samples: ... | elapsed time per
#   iteration (ms): 1147.6 | throughput per GPU (TFLOP/s/GPU): 123.4 | learning rate: ... |
#   global batch size:    16 | lm loss: 1.043E+01 | loss scale: 1.0 | grad norm: 3.1 | ..."
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_MEGATRON_LOSS = re.compile(r"lm loss:\s*([-+\d.Ee]+)")
# megatron/training/utils.py, report_memory():
#  "[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 1234.5 | reserved: ... | max reserved: ..."
_MEGATRON_MEM = re.compile(
    r"\(after \d+ iterations\) memory \(MB\).*?max allocated:\s*([\d.]+).*?max reserved:\s*([\d.]+)"
)

# torchtitan/components/metrics.py, MetricsProcessor.log() (torchtitan main, 2025):
#  "step:  2  loss:  6.1098  grad_norm:  4.6416  memory:  2.49GiB(3.14%)  tps: 177,138  tflops: 96.17  mfu: 9.72%"
_TITAN_STEP = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([-+\d.Ee]+)(?:\s+grad_norm:\s*[-+\d.Ee]+)?\s+memory:\s*([\d.]+)GiB\([\d.]+%\)"
    r"\s+tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)"
)


def parse_megatron(text: str) -> ParsedLog:
    """Per-iteration times (run with --log-interval 1), losses, TFLOP/s and the peak memory report."""
    out = ParsedLog()
    for line in text.splitlines():
        m = _MEGATRON_ITER.search(line)
        if not m:
            mem = _MEGATRON_MEM.search(line)
            if mem:
                alloc, reserved = float(mem.group(1)) / 1024, float(mem.group(2)) / 1024
                out.peak_mem_gib = max(out.peak_mem_gib or 0.0, alloc)
                out.peak_mem_reserved_gib = max(out.peak_mem_reserved_gib or 0.0, reserved)
            continue
        out.step_times_s.append(float(m.group(2)) / 1000)
        if (loss := _MEGATRON_LOSS.search(line)) is not None:
            out.losses.append(float(loss.group(1)))
        if (tf := _MEGATRON_TFLOPS.search(line)) is not None:
            out.reported_tflops.append(float(tf.group(1)))
    return out


def parse_torchtitan(text: str, *, tokens_per_step_per_device: float) -> ParsedLog:
    """torchtitan logs tokens/s per device (tps): step time = tokens per step per device / tps.

    Its memory figure is max reserved; it is kept as the reserved peak.
    """
    out = ParsedLog()
    for m in _TITAN_STEP.finditer(text):
        tps = float(m.group(4).replace(",", ""))
        if tps <= 0:
            continue
        out.step_times_s.append(tokens_per_step_per_device / tps)
        out.losses.append(float(m.group(2)))
        out.reported_tflops.append(float(m.group(5).replace(",", "")))
        out.peak_mem_reserved_gib = max(out.peak_mem_reserved_gib or 0.0, float(m.group(3)))
    return out


# Failure signatures in a trainer's log, most specific first.
FAILURES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    (OOM, re.compile(r"CUDA out of memory|OutOfMemoryError|HIP out of memory|out of memory", re.I), "out of memory"),
    (
        TIMEOUT,
        re.compile(r"DUE TO TIME LIMIT|Watchdog caught collective operation timeout|NCCL.*[Tt]imeout"),
        "time limit or collective timeout",
    ),
    (FAILED, re.compile(r"NCCL (WARN|error)|ncclInternalError|ncclSystemError|ncclUnhandledCudaError"), "NCCL error"),
)


def classify_failure(text: str) -> tuple[str, str]:
    """(status, reason) for a run that produced too few steps, from its log."""
    for status, pattern, what in FAILURES:
        m = pattern.search(text)
        if m:
            line = next((ln for ln in text.splitlines() if pattern.search(ln)), m.group(0))
            return status, f"{what}: {line.strip()[:300]}"
    tail = "\n".join(text.strip().splitlines()[-8:])
    return FAILED, f"the workload produced too few steps\n{tail}".strip()


def placeholders(sweep: Sweep, layout: Layout) -> dict[str, str]:
    """Values a command template may use."""
    world = sweep.cluster.world
    resolved = layout.resolve(sweep)
    values: dict[str, Any] = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in layout.as_dict().items()}
    values.update(
        dp=resolved.dp,
        grad_accum=resolved.grad_accum,
        global_batch_size=sweep.global_batch_size,
        seq_len=sweep.seq_len,
        steps=sweep.trial.steps,
        nproc=sweep.cluster.gpus_per_node,
        nnodes=sweep.cluster.nodes,
        world=world,
        # on SLURM one task per node runs the command: its node's rank and the first node's address
        node_rank=os.environ.get("SLURM_NODEID", "0"),
        master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=os.environ.get("MASTER_PORT") or free_port(),
    )
    return {k: str(v) for k, v in values.items()}


def render_command(template: str, sweep: Sweep, layout: Layout, kind: str) -> list[str]:
    """argv of the workload: the template split like a shell line, each word filled in; `{flags}`
    (a word of its own) becomes the layout's flags for the trainer."""
    values = placeholders(sweep, layout)
    flags = _flags(kind, sweep, layout)
    argv: list[str] = []
    for word in shlex.split(template):
        if word == "{flags}":
            argv.extend(flags)
        else:
            try:
                argv.append(word.format_map(values))
            except (KeyError, ValueError) as e:
                raise ValueError(f"workload.command: unknown placeholder in {word!r}: {e}") from None
    if kind == "torchtitan":
        # tyro hands every word after a subcommand to that subcommand: words of the template that
        # follow {flags} would be refused, so torchtitan's activation-checkpoint:MODE goes last
        sub = [w for w in flags if w.startswith("activation-checkpoint:")]
        argv = [w for w in argv if w not in sub] + sub
    return argv


def _flags(kind: str, sweep: Sweep, layout: Layout) -> list[str]:
    """The layout as the trainer's command-line flags (the same mapping as `sweep best --format`)."""
    rec = layout_record(layout.resolve(sweep).as_fields(), sweep)
    if kind == "megatron":
        args, _ = megatron_args(rec)
        return [*args, "--train-iters", str(sweep.trial.steps), "--log-interval", "1"]
    if kind == "torchtitan":
        args, _ = torchtitan_cli_args(rec)
        return ["--training.steps", str(sweep.trial.steps), "--metrics.log_freq", "1", *args]
    return []


def workload_env(sweep: Sweep, layout: Layout) -> tuple[dict[str, str], list[str]]:
    """The workload's environment (ours, the sweep file's, then what the layout needs) and what was changed.

    Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS per layout (see `export.megatron_env`): a value
    the sweep file sets that this layout's run would refuse is dropped, with a line in the trial's log.
    """
    env = {**os.environ, **{k: str(v) for k, v in sweep.workload.env.items()}}
    if sweep.workload.kind != "megatron":
        return env, []
    world = sweep.cluster.world
    rec = layout_record(
        layout.as_dict() | {"dp": layout.dp(world), "grad_accum": layout.grad_accum(world, sweep.global_batch_size)},
        sweep,
    )
    needed, reasons = megatron_env(rec)
    notes: list[str] = []
    for (name, value), why in zip(needed.items(), reasons):
        if env.get(name) == value:
            continue
        if value is None:
            if name in env:
                notes.append(f"{name}={env.pop(name)} dropped for this layout ({why})")
        else:
            notes.append(f"{name} set to {value}" + (f" (was {env[name]})" if name in env else "") + f" ({why})")
            env[name] = value
    return env, notes


def run_external(sweep: Sweep, layout: Layout, *, workdir: Path, timeout_s: float | None = None) -> TrialResult:
    """Run the sweep's workload command for one layout, parse its log, apply the protocol."""
    wl = sweep.workload
    assert wl is not None and wl.kind != "builtin"
    limit = timeout_s if timeout_s is not None else sweep.trial.timeout_min * 60
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "workload.log"
    try:
        argv = render_command(wl.command, sweep, layout, wl.kind)
    except ValueError as e:
        return without_run(sweep, layout, status=FAILED, error=str(e))
    env, env_notes = workload_env(sweep, layout)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        log.write("".join(f"sweep: {n}\n" for n in env_notes).encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=wl.cwd or None,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            return without_run(sweep, layout, status=FAILED, error=f"cannot start {argv[0]!r}: {e.strerror}")
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            rc = None
    text = log_path.read_text(errors="replace")
    parsed = _parse(wl.kind, text, sweep, layout)
    if rc is None:
        return without_run(
            sweep,
            layout,
            status=TIMEOUT,
            error=f"the workload ran past {limit:.0f} s ({len(parsed.step_times_s)} steps logged)",
        )
    if len(parsed.step_times_s) <= sweep.trial.warmup_steps:
        status, error = classify_failure(text)
        if rc == 0 and status == FAILED:
            error = f"exit code 0 but {error}"
        return without_run(sweep, layout, status=status, error=f"{error} (exit code {rc}, log {log_path})")
    steps = parsed.step_times_s[: sweep.trial.steps]
    return summarize(
        sweep,
        layout,
        step_times_s=steps,
        losses=parsed.losses[: len(steps)],
        peak_mem_gib=parsed.peak_mem_gib,
        peak_mem_reserved_gib=parsed.peak_mem_reserved_gib,
        device=f"{wl.kind} workload",
        startup_s=time.monotonic() - start - sum(steps),
    )


def _parse(kind: str, text: str, sweep: Sweep, layout: Layout) -> ParsedLog:
    parsers: dict[str, Callable[[], ParsedLog]] = {
        "megatron": lambda: parse_megatron(text),
        "torchtitan": lambda: parse_torchtitan(
            text, tokens_per_step_per_device=sweep.global_batch_size * sweep.seq_len / sweep.cluster.world
        ),
    }
    if kind in parsers:
        return parsers[kind]()
    # a plain command may print either format
    parsed = parse_megatron(text)
    return parsed if parsed.step_times_s else parsers["torchtitan"]()

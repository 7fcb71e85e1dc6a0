"""External workloads: trials that run Megatron-LM, torchtitan or any command instead of the built-in trainer.

The sweep file says `workload: {kind: megatron | torchtitan | deepspeed | command, command: "..."}`. The
command is a template: `{flags}` expands to the layout as the trainer's own flags, and
`{tp}`, `{pp}`, `{dp}`, `{micro_batch_size}`, `{grad_accum}`, `{global_batch_size}`,
`{seq_len}`, `{steps}`, `{nproc}`, `{nnodes}`, `{node_rank}`, `{master_addr}`, `{master_port}`,
`{workdir}` (the trial's folder, where the files a trainer reads are written: `Trainer.files`)
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
from functools import partial
from pathlib import Path
from typing import Any

from sweeper.files import open_own
from sweeper.layouts.layout import Layout
from sweeper.process import die_with_parent, free_port, kill_group
from sweeper.results.trial import FAILED, OOM, TIMEOUT, TrialResult, summarize, without_run
from sweeper.spec.sweep import Sweep
from sweeper.trainers import TRAINERS, trainer_of
from sweeper.trainers.export import layout_record

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


def placeholders(sweep: Sweep, layout: Layout, workdir: Path | None = None) -> dict[str, str]:
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
        workdir=str(workdir.resolve()) if workdir is not None else ".",
    )
    return {k: str(v) for k, v in values.items()}


def render_command(template: str, sweep: Sweep, layout: Layout, kind: str, workdir: Path | None = None) -> list[str]:
    """argv of the workload: the template split like a shell line, each word filled in; `{flags}`
    (a word of its own) becomes the layout's flags for the trainer of `kind`."""
    values = placeholders(sweep, layout, workdir)
    trainer = TRAINERS[kind]
    # the layout as the trainer's command-line flags (the same mapping as `sweep best --format`)
    flags = trainer.flags(layout_record(layout.resolve(sweep).as_fields(), sweep), sweep.trial.steps)
    argv: list[str] = []
    for word in shlex.split(template):
        if word == "{flags}":
            argv.extend(flags)
        else:
            try:
                argv.append(word.format_map(values))
            except (KeyError, ValueError) as e:
                raise ValueError(f"workload.command: unknown placeholder in {word!r}: {e}") from None
    return trainer.order_argv(argv, flags)


def workload_env(sweep: Sweep, layout: Layout) -> tuple[dict[str, str], list[str]]:
    """The workload's environment (ours, the sweep file's, then what the layout needs) and what was changed.

    Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS per layout (`Trainer.env`, see `export.megatron_env`): a value
    the sweep file sets that this layout's run would refuse is dropped, with a line in the trial's log.
    """
    env = {**os.environ, **{k: str(v) for k, v in sweep.workload.env.items()}}
    world = sweep.cluster.world
    rec = layout_record(
        layout.as_dict() | {"dp": layout.dp(world), "grad_accum": layout.grad_accum(world, sweep.global_batch_size)},
        sweep,
    )
    needed, reasons = trainer_of(sweep).env(rec)
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
    assert wl is not None and trainer_of(sweep).runs_command
    limit = timeout_s if timeout_s is not None else sweep.trial.timeout_min * 60
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "workload.log"
    rec = layout_record(layout.resolve(sweep).as_fields(), sweep)
    for name, text in trainer_of(sweep).files(rec, sweep).items():
        # on SLURM every node's task writes the same text: a whole file replaces, never half of one
        tmp = workdir / f".{name}.{os.getpid()}"
        with open_own(tmp) as f:  # a link planted at the temp name is replaced, never written through
            f.write(text.encode())
        os.replace(tmp, workdir / name)
    try:
        argv = render_command(wl.command, sweep, layout, wl.kind, workdir)
    except ValueError as e:
        return without_run(sweep, layout, status=FAILED, error=str(e))
    env, env_notes = workload_env(sweep, layout)
    start = time.monotonic()
    with open_own(log_path) as log:
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
                preexec_fn=partial(
                    die_with_parent, os.getpid()
                ),  # a stopped trial's workload must not run on, unsupervised
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
    parsed = trainer_of(sweep).parse_log(text, sweep)
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

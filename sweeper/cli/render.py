"""Rich tables for the terminal: the plan of a dry run, the best layouts and whether the winner's lead is beyond noise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sweeper.knobs import KNOBS, label, shown_in_tables
from sweeper.plan.plan import Plan
from sweeper.plan.summary import CostEstimate, PlanCounts, cost_estimate, plan_counts
from sweeper.spec.models import ModelShape
from sweeper.spec.sweep import Sweep
from sweeper.statuses import PlanStatus
from sweeper.text import for_markup, for_terminal
from sweeper.trainers import recipe_of

if TYPE_CHECKING:
    from sweeper.results.answer import Answer
    from sweeper.results.noise import Margin


def make_console(*, stderr: bool = False) -> Console:
    """A console that does not squeeze tables to 80 columns when output goes to a file or pipe."""
    probe = Console(stderr=stderr)
    return probe if probe.is_terminal else Console(stderr=stderr, width=200)


def message_console(*, stderr: bool = True) -> Console:
    """For warnings, notes and errors. Not wrapped at all into a file or pipe (whatever COLUMNS
    says: a log or a test reads whole lines); on a terminal `say` wraps between words only."""
    probe = Console(stderr=stderr, highlight=False)
    return probe if probe.is_terminal else Console(stderr=stderr, highlight=False, soft_wrap=True)


def say(console: Console, kind: str, text: str, *, style: str = "yellow") -> None:
    """One message, `kind: text` (plain text, not markup). On a terminal it wraps between words
    only, never inside a path or a name (Rich would cut a word longer than the line, and a copied
    path would be wrong); a longer word runs past the edge whole. Unwrapped into a file or pipe."""
    import textwrap

    from rich.text import Text

    whole = f"{kind}: {text}"
    lines = [whole]
    if not console.soft_wrap:
        lines = textwrap.wrap(whole, console.width, break_long_words=False, break_on_hyphens=False) or lines
    for i, line in enumerate(lines):
        out = Text(for_terminal(line))
        if i == 0:
            out.stylize(style, 0, len(kind) + 1)
        console.print(out, soft_wrap=True)


def _gib(v: float) -> str:
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt(v: object) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "-"
    return str(v)


def print_plan(plan: Plan, *, limit: int = 40, console: Console | None = None) -> None:
    """Candidates (knobs that vary, dp, grad_accum, predicted GiB and share of the card), then a summary."""
    console = console or make_console()
    sweep = plan.sweep
    cols = plan.columns()
    # best predicted first: the order in which the default search starts
    cands = np.flatnonzero(cols["status"] == PlanStatus.CANDIDATE)
    cands = cands[np.argsort(-cols["pred_mfu"][cands], kind="stable")]
    varying = [k for k, knob in KNOBS.items() if len(sweep.space[k]) > 1 or knob.always_shown]
    gpu = sweep.cluster.gpu

    table = Table(title=f"{sweep.name}: candidate layouts", title_justify="left", header_style="bold")
    several = sweep.several_sizes  # the node count of each layout, first
    if several:
        table.add_column("nodes", justify="right")
    for k in varying[:3]:
        table.add_column(label(k), justify="right")
    table.add_column("dp", justify="right")
    table.add_column("accum", justify="right")
    for k in varying[3:]:
        table.add_column(label(k), justify="right" if KNOBS[k].kind is int else "left")
    table.add_column("alloc", justify="right")
    table.add_column("reserved", justify="right")
    table.add_column("GiB/GPU", justify="right")
    table.add_column(f"of {gpu.memory_gib:g}", justify="right")
    table.add_column("pred MFU", justify="right")
    shown = cands if limit <= 0 else cands[:limit]
    for i in shown:
        r = {name: values[i] for name, values in cols.items()}
        cells = [str(r["nodes"])] if several else []
        cells += [_fmt(r[k]) for k in varying[:3]] + [str(r["dp"]), str(r["grad_accum"])]
        cells += [_fmt(r[k]) for k in varying[3:]]
        cells += [
            _gib(r["mem_allocated_gib"]),
            _gib(r["mem_reserved_gib"]),
            _gib(r["mem_total_gib"]),
            f"{100 * r['mem_share']:.0f}%",
            f"{100 * r['pred_mfu']:.1f}%",
        ]
        table.add_row(*cells)
    if len(cands):
        console.print(table)
        print_float8_note(console, cols["float8"][shown].tolist(), "pred MFU")
    if len(shown) < len(cands):
        console.print(
            f"[dim]… {len(cands) - len(shown)} more candidates (--limit 0 shows all; --out writes the plan)[/]"
        )

    m = sweep.model
    console.print(
        f"\n[bold]{sweep.name}[/]: {m.name} ({param_counts(m)}), seq {sweep.seq_len}, "
        f"global batch {sweep.global_batch_size}, {_nodes_text(sweep)}×{sweep.cluster.gpus_per_node} {gpu.name}"
        + (f" (cluster.gpu {sweep.gpu_alias} is an alias of {gpu.name})" if sweep.gpu_alias else ""),
        soft_wrap=True,
    )
    if sweep.model_file is not None:
        print_model_file(console, sweep)
    console.print(
        f"memory recipe: [bold]{plan.memory.recipe}[/] ({recipe_summary(sweep)}); "
        "pruning compares the reserved peak + overhead with the card"
    )
    console.print(f"step-time model: {pricing_line(sweep)}", markup=False)
    print_counts(console, plan_counts(plan), sweep.memory.probe_margin)
    from sweeper.launchers.startup import trial_startup

    startup = trial_startup(sweep)
    print_estimate(console, cost_estimate(plan, startup))
    if sweep.search.max_gpu_hours is not None:  # the budget in GPU-hours: how it is expected to split
        from sweeper.search.budget import expected_split, split_line

        line = split_line(expected_split(plan, startup.seconds), sweep.search.max_gpu_hours)
        console.print(f"budget: {for_markup(line)}", soft_wrap=True)
    if sweep.several_sizes or sweep.goal is not None:
        print_plan_sizes(plan, console)


def print_model_file(console: Console, sweep: Sweep) -> None:
    """The shape a config.json gives (`model: {hf_config: ...}`), and a sequence longer than it was trained on."""
    file = sweep.model_file
    assert file is not None
    console.print(for_markup(f"model: {file.architecture} from {file.path}: {shape_line(sweep.model)}"), soft_wrap=True)
    if file.max_positions is not None and sweep.seq_len > file.max_positions:
        say(
            message_console(stderr=False),
            "note",
            f"seq_len {sweep.seq_len} is longer than the config's max_position_embeddings {file.max_positions}",
        )


def shape_line(m: ModelShape) -> str:
    """A shape in a line: `32 layers, hidden 4096, 32 heads (8 kv, head_dim 128), ffn 14336, ...`."""
    parts = [
        f"{m.layers} layers",
        f"hidden {m.hidden}",
        f"{m.heads} heads ({m.kv_heads} kv, head_dim {m.head_dim})",
        f"ffn {m.ffn}",
        f"vocab {m.vocab}",
        "tied embeddings" if m.tied_embeddings else "untied embeddings",
    ]
    parts += [
        name
        for name, on in (("q/k norm", m.qk_norm), ("qkv bias", m.qkv_bias), ("attention bias", m.attention_bias))
        if on
    ]
    if m.is_moe:
        parts.append(f"{m.experts} experts of {m.expert_ffn}, top {m.experts_per_token}")
        parts += [f"{m.shared_experts} shared"] if m.shared_experts else []
        parts += [f"{m.dense_layers} dense blocks first"] if m.dense_layers else []
    return ", ".join(parts) + f"; {param_counts(m)}"


def print_counts(console: Console, counts: PlanCounts, probe_margin: float) -> None:
    """Every status with its count, then the invalid ones per reason: the lines add up to the cross product."""
    width = len(str(counts.layouts))
    console.print(f"layouts in the cross product: [bold]{counts.layouts}[/]")
    for s in counts.statuses:
        text = for_markup(s.text) + (":" if s.reasons else "")
        if s.status == PlanStatus.PRUNED:
            near = f"{counts.near_card} of them within {100 * probe_margin:.0f}% of the card"
            text += f" ({near}: a probe trial if clearly fastest)"
        line = f"  {s.status:<10} {s.count:>{width}}  {text}"
        console.print(f"[bold]{line}[/]" if s.status == PlanStatus.CANDIDATE else line, soft_wrap=True)
        for r in s.reasons:
            console.print(f"  {'':<10} {'':>{width}}  {r.count:>{width}}  {for_markup(r.text)}", soft_wrap=True)


def print_estimate(console: Console, cost: CostEstimate) -> None:
    """The trial budget, and the sweep's GPU-hours and wall time, saying that they are an estimate."""
    console.print(
        f"search: {cost.trials} trials of {cost.runnable} runnable layouts (search.max_trials {cost.budget}), "
        f"{cost.parallel} at a time (search.parallel), {_gpus_each(cost)} GPUs each",
        soft_wrap=True,
    )
    if not cost.trials:
        console.print("estimated cost: nothing to run, 0 GPU-hours")
        return
    console.print(
        f"estimated cost: [bold]{_amount(cost.gpu_hours)} GPU-hours[/], {_duration(cost.wall_hours)} wall "
        f"(an estimate: {cost.assumes})",
        soft_wrap=True,
    )


def _amount(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.2g}"


def _duration(hours: float) -> str:
    if hours >= 48:
        return f"{hours / 24:.1f} days"
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def pricing_line(sweep) -> str:  # noqa: ANN001 - Sweep
    """Which figures price the step: the measured profile (path, date, device) or the GPU table."""
    measured = sweep.cluster.profile
    return (
        for_terminal(measured.source)
        if measured is not None
        else f"no profile: GPU table figures ({sweep.cluster.gpu.name})"
    )


def _gpus_each(cost: CostEstimate) -> str:
    """`64`, or `64 to 256` over several node counts (each trial at its layout's)."""
    return f"{cost.gpus_per_trial} to {cost.gpus_most}" if cost.gpus_most else str(cost.gpus_per_trial)


def _nodes_text(sweep) -> str:  # noqa: ANN001 - Sweep
    """`8`, or `{8, 16, 32}` for a sweep over several node counts."""
    return f"{{{', '.join(map(str, sweep.node_counts))}}}" if sweep.several_sizes else str(sweep.cluster.nodes)


def print_plan_sizes(plan: Plan, console: Console) -> None:
    """The dry run's answer per node count: each size's best predicted layout and its whole run."""
    from sweeper.cli.render_sizes import print_sizes
    from sweeper.plan.sizes import plan_answers

    found, marked = plan_answers(plan)
    title = f"{plan.sweep.name}: best predicted layout per node count (the model uncalibrated: ±band)"
    print_sizes(console, found, marked, plan.sweep.goal, title)


def recipe_summary(sweep) -> str:  # noqa: ANN001 - Sweep
    """The recipe's options in a few words, as the dry run prints them."""
    parts = recipe_of(sweep).summary(sweep.memory)
    from sweeper.estimate.memory import reserved_factor

    if sweep.memory.loss_kernel is not None:  # in place of the recipe's own loss
        parts.append(f"{sweep.memory.loss_kernel} cross-entropy")

    parts.append(f"reserved = {reserved_factor(sweep):.2f} x allocated")
    return "; ".join(parts)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def param_counts(m: ModelShape) -> str:
    """`7.00B params`; a mixture of experts' total and the active count its MFU is over."""
    if not m.is_moe:
        return f"{_params(m.num_params)} params"
    return f"{_params(m.num_params)} params, {_params(m.active_params)} active per token"


BASE_KNOBS = ("tp", "pp", "dp", "micro_batch_size")


def print_best(rows: list[dict[str, Any]], *, top: int, title: str, answer: Answer | None = None) -> None:
    """The top layouts as a table (knobs that vary among the trials), a count of the rest, and the
    winner's lead over the runner-up. With the sweep's `answer` (`sweeper.results.answer`) its
    ranking: over several node counts, the trials of the node count it answers for; else by MFU."""
    from collections import Counter

    from rich.table import Table

    from sweeper.results.noise import row_mfu_range
    from sweeper.results.rows import best_rows

    console = make_console()
    counts = Counter(r["status"] for r in rows)
    verdict = winner_margin(rows)
    chosen = best_rows(rows, top)
    if answer is not None and answer.row is not None:
        chosen, verdict = answer.top(top), answer.margin()
        title += f" at {answer.nodes} node(s) (--by {answer.by.value})" if answer.several else ""
    elif answer is not None and answer.found is not None and chosen:  # no size meets the goal's limits
        title += (
            " of every node count (none meets the goal's limits)"
            if answer.several
            else " (none meets the goal's limits)"
        )
        verdict = None
    if not chosen:
        console.print(
            f"{title}: no successful trial yet ({', '.join(f'{k} {v}' for k, v in counts.items()) or 'no trials'})"
        )
        return
    varying = [k for k in KNOBS if k not in BASE_KNOBS and shown_in_tables(k, rows)]
    base = (*(("nodes",) if len({r.get("nodes") for r in rows}) > 1 else ()), *BASE_KNOBS)  # several node counts
    table = Table(title=title, title_justify="left", header_style="bold")
    text_labels = {label(k) for k, knob in KNOBS.items() if knob.kind is str}
    for col in (
        "#",
        "trial",
        "MFU",
        "MFU 95%",
        "TFLOP/s/GPU",
        "step s",
        *(label(k) for k in (*base, *varying)),
        "peak GiB",
        "pred GiB",
    ):
        table.add_column(col, justify="left" if col in text_labels else "right")
    for i, r in enumerate(chosen, 1):
        knobs = [_cell(r.get(k)) for k in (*base, *varying)]
        table.add_row(
            str(i),
            str(r["trial_number"]),
            f"{100 * r['mfu']:.2f}%",
            row_mfu_range(r),
            _num(r.get("tflops_per_gpu"), 3),
            _num(r.get("step_time_mean_s"), 3),
            *knobs,
            _num(r.get("peak_mem_gib"), 3),
            _num(r.get("pred_mem_gib"), 3),
        )
    if any(str(r.get("device") or "").startswith("cpu") for r in chosen):
        # no allocator on CPU: the number is how much a rank's resident memory grew, far below the estimate
        table.caption = "peak GiB on CPU: RSS growth of a rank during the run, not an allocator peak like pred GiB"
        table.caption_justify = "left"
    console.print(table)
    print_float8_note(console, [r.get("float8") for r in chosen], "MFU")
    console.print(f"{len(rows)} trials: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    if verdict is not None:  # whole, never wrapped: a script or a test reads the line
        console.print(Text(verdict.sentence()), soft_wrap=True)


def winner_margin(rows: list[dict[str, Any]]) -> Margin | None:
    """The winner against the runner-up, within noise or beyond it (None with fewer than two ok trials)."""
    from sweeper.results.noise import margin
    from sweeper.results.rows import best_rows

    two = best_rows(rows, 2)
    return margin(two[0], two[1]) if len(two) == 2 else None


def _cell(v: Any) -> str:
    return ("on" if v else "-") if isinstance(v, bool) else for_markup(v)


def _num(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def print_predicted(rows: list[dict[str, Any]], *, knobs: list[str], title: str) -> None:
    """The plan's best layouts (`sweep best --plan`): predicted MFU and memory, and `knobs` beside tp, pp, dp, mbs."""
    console = make_console()
    varying = [k for k in knobs if k not in BASE_KNOBS]
    table = Table(header_style="bold")
    text_labels = {label(k) for k, knob in KNOBS.items() if knob.kind is str}
    for col in ("#", "pred MFU", *(label(k) for k in (*BASE_KNOBS, *varying)), "pred GiB"):
        table.add_column(col, justify="left" if col in text_labels else "right")
    for i, r in enumerate(rows, 1):
        cells = [_cell(r.get(k)) for k in (*BASE_KNOBS, *varying)]
        table.add_row(str(i), f"{100 * r['pred_mfu']:.1f}%", *cells, _num(r.get("mem_total_gib"), 3))
    console.print(title, soft_wrap=True)
    console.print(table)
    print_float8_note(console, [r.get("float8") for r in rows], "pred MFU")


# MFU's denominator is the bf16 peak for a float8 run too (sweeper.spec.hardware.GPU.peak_flops, as
# torchtitan counts it): its matmuls may run at up to the fp8 peak, twice as fast, so its MFU can
# pass what a bf16 run reaches, and a reader takes 81 % for a mistake unless told
FLOAT8_MFU_NOTE = (
    "{column} of a float8 layout is against the card's dense bf16 peak, as torchtitan counts it, not its "
    "fp8 peak (twice that): it can pass what bf16 layouts reach"
)


def print_float8_note(console: Console, float8: list[Any], column: str) -> None:
    """Under a table that shows MFU: the note above, where one of its rows is a float8 layout."""
    if any(bool(v) and v == v for v in float8):  # NaN: a row from before the knob existed
        console.print(f"[dim]{FLOAT8_MFU_NOTE.format(column=column)}[/]", soft_wrap=True)

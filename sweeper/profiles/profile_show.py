"""What a measured profile holds, line by line, as `sweep profile show` prints it. Pure."""

from __future__ import annotations

from pathlib import Path

from sweeper.profiles.profile import DP_WRAPPERS, SCHEMA, Profile, host_costs


def describe(profile: Profile, path: Path) -> list[str]:
    """What a measured profile holds and where it came from, line by line (`sweep profile show`)."""
    v = profile.versions
    soft = ", ".join(f"{k} {getattr(v, k)}" for k in ("torch", "cuda", "nccl", "driver", "python") if getattr(v, k))
    lines = [
        f"{path}: measured profile (schema {SCHEMA}) of {profile.device} (gpu: {profile.gpu})",
        f"measured {profile.measured_at} on {profile.host}, {soft}; collectives over {v.backend}",
        f"shapes from: {profile.shapes_from}; {profile.processes} processes, {profile.threads} threads each",
        f"host launch overhead: {profile.launch_s * 1e6:.1f} us per small op (forward and backward)",
    ]
    for dtype in sorted({g.dtype for g in profile.gemm}):
        gemms = [g for g in profile.gemm if g.dtype == dtype]
        tf = [2.0 * g.m * g.n * g.k * 3 / (g.fwd_s + g.bwd_s) / 1e12 for g in gemms]
        lines.append(f"GEMM {dtype}: {len(gemms)} shapes, {min(tf):.3g} to {max(tf):.3g} TFLOP/s (forward + backward)")
    for kernel in sorted({a.kernel for a in profile.attention}):
        attn = [a for a in profile.attention if a.kernel == kernel]
        seqs = sorted({a.seq for a in attn})
        lines.append(f"attention {kernel}: {len(attn)} shapes, seq {', '.join(map(str, seqs))}")
    for op, mode in sorted({(e.op, e.mode) for e in profile.elementwise}):
        elems = sorted((e for e in profile.elementwise if (e.op, e.mode) == (op, mode)), key=lambda e: e.elements)
        ns = (elems[-1].fwd_s + elems[-1].bwd_s) / elems[-1].elements * 1e9
        lines.append(
            f"memory-bound {op} ({mode}): {len(elems)} sizes, {ns:.3g} ns per element at {elems[-1].elements:,}"
        )
    for b in profile.block:
        if b.knob in DP_WRAPPERS:
            lines.append(f"tiny model of {b.value} blocks at {b.rows} rows, wrapper {b.knob}: {b.seconds * 1e3:.3g} ms")
        else:
            lines.append(f"block at {b.rows} rows, {b.knob}={b.value}: {b.seconds * 1e3:.3g} ms (host overhead)")
    for ref in profile.reference_steps:
        lines.append(f"reference step ({ref.layout}): {ref.measured_s:.4g} s measured, {ref.predicted_s:.4g} s priced")
    if profile.reference_steps:
        per_step, per_pass = host_costs(profile.reference_steps)
        lines.append(f"added to every step: {per_step:.3g} s, and {per_pass * 1e3:.3g} ms a block pass")
    if profile.nodes > 1:
        where = "namespaces of one machine" if profile.shared_host else "machines"
        lines.append(f"{profile.nodes} nodes ({where}), link: {profile.link or 'not described'}")
    for coll, scope in sorted({(c.op, c.scope) for c in profile.collectives}):
        comm = [c for c in profile.collectives if (c.op, c.scope) == (coll, scope)]
        best = max(comm, key=lambda c: c.busbw_gbps)
        lines.append(
            f"{coll} ({scope}-node): {len(comm)} sizes on {', '.join(str(n) for n in sorted({c.ranks for c in comm}))} "
            f"ranks, up to {best.busbw_gbps:.3g} GB/s bus bandwidth at {best.bytes:,} bytes"
        )
    if not profile.collectives:
        lines.append("collectives: not measured (one device): the GPU table's bandwidths are used")
    return lines

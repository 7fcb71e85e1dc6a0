"""Machine profiles (`sweeper.profiles.profile`, `sweeper.estimate.profiled`): the file round-trips and is refused with
one line naming the field; the step-time model prices from a profile as its numbers say; a sweep's
identity ignores the profile; the cached profile of the cluster's GPU is found."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from sweeper.errors import SpecError
from sweeper.estimate.host import core_share
from sweeper.estimate.moe import reduction_groups
from sweeper.estimate.predict import predict
from sweeper.estimate.profiled import BLOCK_TENSORS, END_TENSORS
from sweeper.estimate.shapes import DEFAULT_CPU, block_gemms, elementwise_sizes
from sweeper.layouts.layout import Layout
from sweeper.profiles.cache import cache_dir, cached_profile_path
from sweeper.profiles.lookup import Lookup
from sweeper.profiles.profile import (
    DP_WRAPPER_DEPTHS,
    DP_WRAPPERS,
    SCHEMA,
    AttentionPoint,
    BlockPoint,
    CollectivePoint,
    ElementwisePoint,
    GemmPoint,
    Profile,
    ProfileError,
    ReferenceStep,
    Versions,
    host_costs,
    load_profile,
    save_profile,
)
from sweeper.profiles.profile_show import describe
from sweeper.results.identity import sweep_identity
from sweeper.spec.loader import parse_sweep
from tests.conftest import SPACES, cli_env, sweep_cli

TINY = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())


def synthetic_profile(*, tflops: float = 0.05, gbps: float = 5.0, gpu: str = "cpu") -> Profile:
    """A profile of a machine whose GEMMs run at `tflops` and whose memory-bound work moves 8 bytes
    per element at `gbps` (each with a 20 us launch), over the default CPU shapes."""
    gemm, elem = [], []
    for w in DEFAULT_CPU:
        for tp in w.tps:
            for rows in (16, *(b * w.seq_len for b in w.micro_batches)):
                for m, n, k in block_gemms(w.shape, rows, tp):
                    t = 20e-6 + 2.0 * m * n * k / (tflops * 1e12)
                    gemm.append(GemmPoint(dtype="fp32", m=m, n=n, k=k, fwd_s=t, bwd_s=2 * t))
                for op, r, width in elementwise_sizes(w.shape, rows, tp):
                    t = 20e-6 + 8.0 * r * width / (gbps * 1e9)
                    elem.append(ElementwisePoint(op=op, mode="eager", elements=r * width, fwd_s=t, bwd_s=2 * t))
    elem += [
        ElementwisePoint(op="adamw", mode="fused", elements=n, fwd_s=1e-5 + 28.0 * n / 5e9, bwd_s=0.0)
        for n in (10**3, 10**7)
    ]
    attention = [
        AttentionPoint(
            kernel="flash2", batch=1, heads=h, kv_heads=2, head_dim=16, seq=s, fwd_s=1e-4 * s / 64, bwd_s=2e-4 * s / 64
        )
        for h in (2, 4)
        for s in (16, 64, 128)
    ]
    comm = [
        CollectivePoint(
            op=op, scope="intra", ranks=2, bytes=b, seconds=1e-4 + b / 1e9, busbw_gbps=b / (1e-4 + b / 1e9) / 1e9
        )
        for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
        for b in (4096, 1 << 20, 1 << 24)
    ]
    return Profile(
        schema=SCHEMA,
        gpu=gpu,
        device="test CPU",
        host="here",
        measured_at="2026-01-01T00:00:00+00:00",
        versions=Versions(python="3.11", torch="2.13", backend="gloo"),
        shapes_from="default",
        processes=2,
        cpus=2,
        threads=1,
        launch_s=2e-5,
        block_base={"attention": "flash2", "rmsnorm": "eager", "activation_checkpointing": "none", "compile": "false"},
        gemm=tuple(gemm),
        attention=tuple(attention),
        elementwise=tuple(elem),
        block=(BlockPoint(knob="base", value="base", rows=16, seconds=5e-3),),
        collectives=tuple(comm),
    )


def tiny_sweep(tmp_path: Path, **cluster: object):
    spec = dict(TINY, cluster={**TINY["cluster"], **cluster})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path, parse_sweep(path.read_text(), source=str(path))


def test_profile_round_trips(tmp_path):
    p = synthetic_profile()
    save_profile(p, tmp_path / "p.profile.yaml")
    back = load_profile(tmp_path / "p.profile.yaml")
    assert back == p
    text = (tmp_path / "p.profile.yaml").read_text()
    assert text.startswith("schema: 1\nkind: measured\ngpu: cpu\n")
    assert any("GEMM fp32" in line for line in describe(back, tmp_path / "p.profile.yaml"))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"schema": 999}, "schema: 999 is not readable here; allowed: 1"),
        ({"kind": "guessed"}, "kind: 'guessed' unknown; allowed: measured, learned"),
        ({"launch_s": "fast"}, "launch_s: "),
        ({"gemm": [{"dtype": "fp64", "m": 1, "n": 1, "k": 1, "fwd_s": 1, "bwd_s": 1}]}, "gemm.0.dtype: "),
        ({"gpu": "h100-sxm"}, "gpu: h100-sxm was measured on test CPU; this sweep's cluster has gpu cpu"),
    ],
)
def test_a_bad_profile_is_one_line_naming_the_field(tmp_path, edit, words):
    data = synthetic_profile().to_dict() | edit
    bad = tmp_path / "bad.profile.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as e:
        load_profile(bad, gpu="cpu")
    assert words in str(e.value) and "\n" not in str(e.value)
    # through the sweep file: exit 2, the field named, no traceback
    spec, _ = tiny_sweep(tmp_path)
    spec.write_text(spec.read_text().replace("gpu: cpu", f"gpu: cpu\n  profile: {bad}"))
    r = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cluster.profile" in r.stderr and words in r.stderr and "Traceback" not in r.stderr


def test_a_missing_profile_file_is_named(tmp_path):
    with pytest.raises(SpecError, match="cluster.profile: .*nowhere.yaml: no such profile file"):
        tiny_sweep(tmp_path, profile=str(tmp_path / "nowhere.yaml"))


def test_the_profile_prices_the_parts_as_its_numbers_say(tmp_path):
    save_profile(synthetic_profile(), tmp_path / "fast.yaml")
    save_profile(synthetic_profile(tflops=0.025), tmp_path / "slow_gemm.yaml")
    _, table = tiny_sweep(tmp_path)
    _, fast = tiny_sweep(tmp_path, profile=str(tmp_path / "fast.yaml"))
    _, slow = tiny_sweep(tmp_path, profile=str(tmp_path / "slow_gemm.yaml"))
    cols = Layout.from_mapping({"tp": 1, "pp": 1, "micro_batch_size": 2}).columns(table)
    a, b, t = predict(cols, fast), predict(cols, slow), predict(cols, table)
    # half the GEMM throughput: the matmul part grows by its arithmetic (the 20 us launches stay), nothing else moves
    assert 1.5 < b.parts["matmul"][0] / a.parts["matmul"][0] < 2.0
    assert b.parts["memory_bound"][0] == pytest.approx(a.parts["memory_bound"][0])
    assert b.total[0] > a.total[0] and b.mfu[0] < a.mfu[0]
    # the profile's numbers, not the table's: another step time, and the same parts the report reads
    assert set(a.parts) == set(t.parts) and a.total[0] != pytest.approx(t.total[0], rel=0.05)
    assert a.total[0] == pytest.approx(sum(a.parts[k] for k in a.parts if not k.endswith("_hidden"))[0])


def test_checkpointing_and_tensor_parallelism_cost_what_the_profile_measured(tmp_path):
    save_profile(synthetic_profile(), tmp_path / "p.yaml")
    _, sweep = tiny_sweep(tmp_path, profile=str(tmp_path / "p.yaml"))

    def total(**knobs: object) -> float:
        cols = Layout.from_mapping({"tp": 1, "pp": 1, "micro_batch_size": 2} | knobs).columns(sweep)
        return float(predict(cols, sweep).total[0])

    # full recomputation runs the forward again: more than selective's memory-bound forward, which costs something
    assert total(activation_checkpointing="full") > total(activation_checkpointing="selective") > total()
    # a tensor-parallel layout pays its measured collectives
    cols = Layout.from_mapping({"tp": 2, "pp": 1, "micro_batch_size": 2}).columns(sweep)
    assert predict(cols, sweep).parts["tp_comm"][0] > 0


def test_the_profile_leaves_the_identity_alone(tmp_path):
    save_profile(synthetic_profile(), tmp_path / "p.yaml")
    _, plain = tiny_sweep(tmp_path)
    _, profiled = tiny_sweep(tmp_path, profile=str(tmp_path / "p.yaml"))
    assert profiled.cluster.profile is not None and plain.cluster.profile is None
    assert sweep_identity(profiled) == sweep_identity(plain)
    assert profiled.cluster == plain.cluster
    assert replace(profiled.cluster, profile=None) == plain.cluster
    linked = replace(profiled, cluster=replace(profiled.cluster, link="tbf 1Gbit"))  # `cluster.link`, likewise
    assert sweep_identity(linked) == sweep_identity(plain) and linked.cluster == plain.cluster


def test_the_cached_profile_of_the_clusters_gpu_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache" / "sweep" / "profiles"
    _, before = tiny_sweep(tmp_path)
    save_profile(synthetic_profile(), cached_profile_path("cpu"))
    _, after = tiny_sweep(tmp_path)
    assert before.cluster.profile is None
    assert after.cluster.profile is not None and str(cached_profile_path("cpu")) in after.cluster.profile.source
    cols = Layout.from_mapping({"tp": 1, "pp": 1, "micro_batch_size": 1}).columns(before)
    assert not np.allclose(predict(cols, after).total, predict(cols, before).total)
    # `forget --gpu` drops it, and the table prices again
    env_cache = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = sweep_cli("profile", "forget", "--gpu", "cpu", cwd=tmp_path, env=cli_env(**env_cache))
    assert r.returncode == 0, r.stderr
    assert not cached_profile_path("cpu").exists()
    r = sweep_cli("profile", "forget", "--gpu", "cpu", cwd=tmp_path, env=cli_env(**env_cache))
    assert r.returncode == 2 and "no cached profile" in r.stderr


def test_profile_parses_its_file_and_options_in_any_order_and_refuses_the_rest(tmp_path):
    spec, _ = tiny_sweep(tmp_path)
    for args in (["--bogus"], ["extra"]):
        r = sweep_cli("profile", str(spec), *args, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = sweep_cli("profile", str(spec), "--out", str(tmp_path / "p.json"), cwd=tmp_path)
    assert r.returncode == 2 and "--out" in r.stderr and ".yaml" in r.stderr


def test_on_a_gpu_the_hosts_overhead_shows_only_where_it_outlasts_the_kernels(tmp_path):
    # the tiny block took the host 5 ms a pass; fast kernels leave it exposed, slow ones hide it
    def framework(tflops: float) -> float:
        path = tmp_path / f"h200_{tflops}.yaml"
        save_profile(synthetic_profile(tflops=tflops, gpu="h200"), path)
        _, sweep = tiny_sweep(tmp_path, gpu="h200", profile=str(path))
        cols = Layout.from_mapping({"tp": 1, "pp": 1, "micro_batch_size": 1}).columns(sweep)
        passes = sweep.model.layers * int(cols["grad_accum"][0])
        fixed = sweep.trainer.time.microbatch_s * int(cols["grad_accum"][0])
        return (float(predict(cols, sweep).parts["framework"][0]) - fixed) / passes

    assert 0.0 < framework(1000.0) < 5e-3
    assert framework(1e-4) == 0.0


def test_profiling_a_gpu_sweep_on_a_node_without_one_is_refused(tmp_path):
    spec, _ = tiny_sweep(tmp_path, gpu="h100-sxm")
    r = sweep_cli("profile", str(spec), "--quick", cwd=tmp_path, env=cli_env(CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 2, r.stderr
    assert "the cluster's GPU is h100-sxm and this node has none" in r.stderr and "Traceback" not in r.stderr


def wrapped_points(per_block: dict[str, float], per_model: dict[str, float]) -> tuple[BlockPoint, ...]:
    """The tiny model at the profile's two depths under each data-parallel wrapper, costing `per_block`
    and `per_model` seconds more than unwrapped (a 4 ms block, a 2 ms model of its own)."""
    out = []
    for wrapper in DP_WRAPPERS:
        for n in DP_WRAPPER_DEPTHS:
            extra = per_block.get(wrapper, 0.0) * n + per_model.get(wrapper, 0.0)
            out.append(BlockPoint(knob=wrapper, value=str(n), rows=16, seconds=4e-3 * n + 2e-3 + extra))
    return tuple(out)


def test_the_data_parallel_wrappers_cost_what_the_profile_measured(tmp_path):
    per_block = {"ddp": 1e-3, "replicate": 3e-3, "replicate_sync": 5e-3, "fsdp": 7e-3}
    per_model = {"ddp": 2e-3, "replicate": 4e-3, "replicate_sync": 6e-3, "fsdp": 9e-3}
    # measured on 4 ranks of 4 cores (on fewer, a pipeline would be priced by its busiest core: `core_share`)
    base = synthetic_profile()
    four = tuple(c.model_copy(update={"ranks": 4}) for c in base.collectives)  # its collectives over the 4 ranks
    plain = base.model_copy(update={"processes": 4, "cpus": 4, "collectives": four})
    wrapped = plain.model_copy(update={"block": plain.block + wrapped_points(per_block, per_model)})
    save_profile(plain, tmp_path / "plain.yaml")
    save_profile(wrapped, tmp_path / "wrapped.yaml")
    _, without = tiny_sweep(tmp_path, gpus_per_node=4, profile=str(tmp_path / "plain.yaml"))
    _, with_ = tiny_sweep(tmp_path, gpus_per_node=4, profile=str(tmp_path / "wrapped.yaml"))
    space = dict(with_.space, sharding=("none", "fsdp"))
    without, with_ = replace(without, space=space), replace(with_, space=space)

    def added(**knobs: object) -> float:
        cols = Layout.from_mapping({"tp": 1, "pp": 1, "micro_batch_size": 1} | knobs).columns(with_)
        return float(predict(cols, with_).parts["framework"][0] - predict(cols, without).parts["framework"][0])

    # 4 layers, global batch 8 on 4 ranks at micro-batch 1: dp 4 runs 2 micro-batches of 4 blocks;
    # pp 2 x dp 2 runs 4 micro-batches of the busiest stage's 2 blocks
    assert added(sharding="fsdp") == pytest.approx(2 * (7e-3 * 4 + 9e-3))  # every micro-batch
    assert added() == pytest.approx(1e-3 * 4 + 2e-3)  # DDP: once, on the micro-batch that reduces
    hooks, syncing = 3e-3 * 2 + 4e-3, 5e-3 * 2 + 6e-3
    assert added(pp=2) == pytest.approx(4 * hooks + (syncing - hooks))  # replicate: hooks on all, copies once
    assert added(pp=4) == 0.0  # one data-parallel rank: no wrapper


def test_zero1_sends_each_parameter_tensor_as_the_broadcast_the_profile_measured(tmp_path):
    """The built-in trainer's ZeRO-1 (torch's ZeroRedundancyOptimizer) broadcasts every parameter tensor
    from its owner: priced as that many broadcasts of a tensor's share where the profile measured
    broadcasts, as one all-gather of the parameters where it did not (an older profile)."""
    plain = synthetic_profile()
    slow = [  # a broadcast four times as dear as the ring's collectives, with a 0.3 ms start
        CollectivePoint(
            op="broadcast",
            scope="intra",
            ranks=2,
            bytes=b,
            seconds=3e-4 + 4 * b / 1e9,
            busbw_gbps=b / (3e-4 + 4 * b / 1e9) / 1e9,
        )  # fmt: skip
        for b in (4096, 1 << 20, 1 << 24)
    ]
    save_profile(plain, tmp_path / "plain.yaml")
    save_profile(plain.model_copy(update={"collectives": plain.collectives + tuple(slow)}), tmp_path / "bcast.yaml")
    priced = {}
    for name in ("plain", "bcast"):
        _, sweep = tiny_sweep(tmp_path, profile=str(tmp_path / f"{name}.yaml"))
        sweep = replace(sweep, space=dict(sweep.space, sharding=("none", "zero1")))
        cols = {
            sharding: Layout.from_mapping({"tp": 1, "pp": 1, "micro_batch_size": 2, "sharding": sharding}).columns(
                sweep
            )
            for sharding in ("none", "zero1")
        }
        dp = {k: float(predict(c, sweep).parts["dp_comm"][0]) for k, c in cols.items()}
        priced[name] = dp["zero1"] - dp["none"]  # what ZeRO-1 sends back beyond the gradients' all-reduce
        ((params, _, _),) = reduction_groups(cols["zero1"], sweep)
    grads = float(params[0]) * 4.0
    tensors = 4 * BLOCK_TENSORS + END_TENSORS  # the tiny sweep's 4 blocks, the embedding and the head
    gather = Lookup(plain).collective_s("all_gather", "intra", np.array([2.0]), np.array([grads]))[0]
    assert priced["plain"] == pytest.approx(gather)  # one all-gather of the parameters
    with_bcast = Lookup(load_profile(tmp_path / "bcast.yaml"))
    one = with_bcast.collective_s("broadcast", "intra", np.array([2.0]), np.array([grads / tensors]))[0]
    assert priced["bcast"] == pytest.approx(tensors * one)  # a broadcast per tensor, of its share
    assert priced["bcast"] > tensors * 3e-4 > 10 * priced["plain"]  # each with its start: dearer than one gather


def reference(blocks: int, gap_s: float) -> ReferenceStep:
    what = f"dp=2, 2 micro-batches of 1, {blocks} of the model's 4 blocks"
    return ReferenceStep(layout=what, passes=2 * blocks, measured_s=0.2 + gap_s, predicted_s=0.2)


def test_host_costs_part_a_steps_waits_from_a_block_pass(tmp_path):
    assert host_costs(()) == (0.0, 0.0)
    assert host_costs((reference(2, 0.1),)) == pytest.approx((0.1, 0.0))  # one depth: all of it a step's
    # 0.05 s a step and 10 ms a pass (2 and 6 passes)
    assert host_costs((reference(1, 0.07), reference(3, 0.11))) == pytest.approx((0.05, 0.01))
    assert host_costs((reference(1, 0.09), reference(3, 0.07))) == pytest.approx((0.08, 0.0))  # deeper waited less
    # a line that would start below zero goes through the origin instead: (2*0.01 + 6*0.1) / (4 + 36)
    assert host_costs((reference(1, 0.01), reference(3, 0.1))) == pytest.approx((0.0, 0.0155))
    # a step faster than priced adds nothing
    assert host_costs((ReferenceStep(layout="x", passes=2, measured_s=0.1, predicted_s=0.2),)) == (0.0, 0.0)


def test_reference_steps_add_what_whole_steps_took_beyond_their_parts(tmp_path):
    plain = synthetic_profile().model_copy(update={"cpus": 1})  # 2 ranks on 1 core: where they are measured
    refs = (reference(1, 0.07), reference(3, 0.11))  # 0.05 s a step, 10 ms a block pass
    save_profile(plain, tmp_path / "plain.yaml")
    save_profile(plain.model_copy(update={"reference_steps": refs}), tmp_path / "ref.yaml")
    _, without = tiny_sweep(tmp_path, profile=str(tmp_path / "plain.yaml"))
    _, with_ = tiny_sweep(tmp_path, profile=str(tmp_path / "ref.yaml"))
    # the busiest rank's block passes a step: dp 2 x 2 micro-batches of 4 blocks; pp 2: 8 micro-batches of 2
    for knobs, passes in (
        ({"tp": 1, "pp": 1, "micro_batch_size": 2}, 8),
        ({"tp": 1, "pp": 2, "micro_batch_size": 1}, 16),
    ):
        cols = Layout.from_mapping(knobs).columns(with_)
        a, b = predict(cols, without), predict(cols, with_)
        added = 0.05 + 0.01 * passes
        # a pipeline's work is paced by its busiest core, which the passes' waits move a little
        # (by 1 % here); data parallelism's ranks all do the same
        rel = 1e-12 if knobs["pp"] == 1 else 1e-2
        assert b.parts["framework"][0] == pytest.approx(a.parts["framework"][0] + added, rel=rel)
        others = [k for k in a.parts if k not in ("framework", "bubble")]
        assert all(b.parts[k][0] == pytest.approx(a.parts[k][0], rel=rel) for k in others)
        assert b.total[0] >= a.total[0] + added * (1 - rel)
    text = "\n".join(describe(load_profile(tmp_path / "ref.yaml"), tmp_path / "ref.yaml"))
    assert "added to every step: 0.05 s, and 10 ms a block pass" in text
    assert (
        "reference step (dp=2, 2 micro-batches of 1, 3 of the model's 4 blocks): 0.31 s measured, 0.2 s priced" in text
    )
    # a ratio no host explains (a trial that hung, a wrong reading) is refused in one line naming the field
    bad = plain.to_dict() | {"reference_steps": [refs[0].model_dump() | {"measured_s": 3.0}]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ProfileError, match=r"reference_steps\.0: .*a ratio of 15; allowed: 0.25 to 4") as e:
        load_profile(tmp_path / "bad.yaml")
    assert "\n" not in str(e.value)


def test_a_profile_across_nodes_with_a_launcher_that_cannot_run_one_is_refused(tmp_path):
    """`--nodes N` runs through the sweep's launcher: SLURM or the local namespaces; torchx is named and refused."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({**TINY, "launcher": {"kind": "torchx", "scheduler": "local_cwd"}}))
    r = sweep_cli("profile", str(spec), "--nodes", "2", "--quick", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "--nodes 2 with launcher torchx: a profile across nodes runs with launcher slurm" in line, r.stderr
    assert "Traceback" not in r.stderr


def test_ranks_bound_to_crowded_cores_are_priced_by_their_busiest_core(tmp_path):
    """4 ranks of two namespaces on 2 cores, bound round-robin (rank r on core r % 2): a pipeline's
    busiest core, not its busiest rank at the crowd's pace, sets the step."""
    shared = synthetic_profile().model_copy(update={"processes": 4, "nodes": 2, "shared_host": True})
    _, sweep = tiny_sweep(tmp_path, nodes=2)  # 2 nodes x 2 ranks, 4 blocks
    cols = {pp: Layout.from_mapping({"tp": 1, "pp": pp, "micro_batch_size": 1}).columns(sweep) for pp in (1, 2, 4)}
    block, end = np.array([2.0]), np.array([1.0])  # a block's seconds and the head's, a micro-batch
    share = {pp: core_share(shared, c, 4, (4, 4), block_s=block, end_s=end)[0] for pp, c in cols.items()}
    assert share[1] == 1.0  # every rank the same work
    # pp 4: core 1 holds stages 1 and 3 (a block; a block and the head), 5 s, against 2 x 3 s priced
    assert share[4] == pytest.approx(5 / 6)
    # pp 2: each core holds a rank of each stage (2 blocks; 2 blocks and the head), 9 s against 2 x 5 s
    assert share[2] == pytest.approx(9 / 10)
    # a rank with a core of its own, or a GPU: nothing changes
    assert core_share(shared, cols[4], 4, (4, 2), block_s=block, end_s=end)[0] == 1.0
    assert core_share(shared.model_copy(update={"gpu": "h100"}), cols[4], 4, (4, 4), block_s=block, end_s=end)[0] == 1.0


def _repeated(base: Profile, factor: float, *, slowed_first: bool) -> dict:
    """`base` as a file whose every table holds each row twice, once with its times x `factor`."""

    def slowed(r):  # noqa: ANN001, ANN202 - a profile row
        fields = [f for f in type(r).model_fields if f.endswith("_s") or f == "seconds"]
        return r.model_copy(update={f: getattr(r, f) * factor for f in fields})

    out = base.to_dict()
    for t in ("gemm", "attention", "elementwise", "block", "collectives"):
        rows = [slowed(r) for r in getattr(base, t)] + list(getattr(base, t))
        rows = rows if slowed_first else rows[len(rows) // 2 :] + rows[: len(rows) // 2]
        out[t] = [r.model_dump(mode="json", by_alias=True) for r in rows]
    return out


def test_rows_that_repeat_a_shape_predict_the_same_in_any_order(tmp_path):
    """Issue 48: a profile whose rows repeat one shape answered by file order (6.7 % against 24.7 %
    predicted MFU). Rows within noise of each other merge (each time the geometric mean of theirs)."""
    base = synthetic_profile()
    preds = []
    for name, first in (("a", True), ("b", False)):
        save_profile(Profile.model_validate(_repeated(base, 1.5, slowed_first=first)), tmp_path / f"{name}.yaml")
        _, sweep = tiny_sweep(tmp_path, profile=str(tmp_path / f"{name}.yaml"))
        cols = Layout.from_mapping({"tp": 2, "pp": 1, "micro_batch_size": 1}).columns(sweep)
        preds.append(predict(cols, sweep))
    assert preds[0].mfu[0] == pytest.approx(preds[1].mfu[0], rel=1e-12)
    merged = Profile.model_validate(_repeated(base, 1.5, slowed_first=True))
    assert [b.seconds for b in merged.block] == [pytest.approx(5e-3 * 1.5**0.5)]  # one row, the geometric mean


def test_rows_of_one_shape_that_contradict_each_other_are_refused_in_one_line(tmp_path):
    # a measurement's own repeats (two shapes of one size, a noisy CPU: 10x) merge as it is made...
    measured = Profile.model_validate(_repeated(synthetic_profile(), 10.0, slowed_first=False))
    assert [b.seconds for b in measured.block] == [pytest.approx(5e-3 * 10**0.5)]
    # ...and a file, which `sweep profile` writes with each shape once, holding them is a contradiction
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_repeated(synthetic_profile(), 10.0, slowed_first=False), sort_keys=False))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "gemm: 2 rows of one shape ('fp32'," in message and "over 2x apart; keep one row per shape" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        # a 2-rank profile claiming 64 processes on 1 core multiplied predicted MFU 3.5-5x
        ({"processes": 64, "cpus": 1}, "processes: 64, but its collectives ran on 2 ranks a node; allowed: 2"),
        ({"cpus": 8}, "threads: 1 per process, but 2 processes share 8 cores; allowed: 4"),
        # a host's waits, on ranks that each had a core of their own, predicted 0.0 % everywhere
        (
            {"reference_steps": [{"layout": "x", "passes": 2, "measured_s": 3999.0, "predicted_s": 1000.0}]},
            "reference_steps: measured only on CPU ranks that outnumber the cores, here 2 processes on 2 cores",
        ),
        (
            {"nodes": 1, "shared_host": True},
            "nodes: 1, but collectives across nodes or shared_host: true; allowed: nodes of 2 or more",
        ),
    ],
)
def test_a_profile_whose_numbers_contradict_each_other_is_refused_in_one_line(tmp_path, edit, words):
    """Issue 48: numbers each within bounds that no run of `sweep profile` writes together."""
    data = synthetic_profile().to_dict() | edit
    bad = tmp_path / "bad.profile.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as e:
        load_profile(bad)
    assert f"{bad}: profile: {words}" == str(e.value)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(dict(TINY, cluster={**TINY["cluster"], "profile": str(bad)})))
    r = sweep_cli("run", str(spec), "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_collectives_of_other_ranks_or_below_any_interconnect_are_refused(tmp_path):
    base = synthetic_profile().to_dict()
    rows = base["collectives"]
    cases = {
        # within a node over two rank counts: a profile measures them once, over all its ranks
        "mixed": [rows[0], dict(rows[1], ranks=4)],
        # across 2 nodes, 1 of each node's ranks: a group of 2, not 3
        "odd": [dict(rows[0], scope="inter", ranks=3, per_node=1)],
        # a bus bandwidth of 1e-300 GB/s priced every layout that communicates at 0.0 % MFU
        "slow": [dict(rows[0], busbw_gbps=1e-300)],
        "stuck": [dict(rows[0], seconds=3600.0)],
    }
    said = {}
    for name, collectives in cases.items():
        path = tmp_path / f"{name}.yaml"
        nodes = {"nodes": 2, "processes": 2} if name == "odd" else {}
        path.write_text(yaml.safe_dump(base | nodes | {"collectives": collectives}))
        with pytest.raises(ProfileError) as e:
            load_profile(path)
        said[name] = str(e.value).removeprefix(f"{path}: ")
        assert "\n" not in said[name]
    assert (
        said["mixed"]
        == "profile: collectives: within a node over [2, 4] ranks; a profile measures them over all its ranks, once"
    )
    op = rows[0]["op"]
    assert (
        said["odd"]
        == f"profile: collectives: {op} across 2 nodes over 3 ranks with per_node 1; allowed: 2 x per_node ranks"
    )
    floor = "slower than any interconnect; allowed: at most 1 s of latency, then 1 MB/s or faster (1 s)"
    assert said["slow"].startswith(f"collectives.0: busbw_gbps 1e-300 GB/s: {op} of 4,096 bytes over 2 ranks in ")
    assert said["slow"].endswith(floor)
    assert said["stuck"] == f"collectives.0: seconds: {op} of 4,096 bytes over 2 ranks in 3.6e+03 s, {floor}"

"""Accelerator table: memory and dense peak FLOP/s, the denominators of MFU and of the memory check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

TERA = 1e12
GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One accelerator type. Peaks are dense (no 2:4 sparsity) matrix FLOP/s, in TFLOP/s."""

    name: str
    memory_gib: float
    bf16_tflops: float
    tf32_tflops: float | None = None
    fp8_tflops: float | None = None
    note: str = ""
    # Bandwidths in GB/s per device, one direction: HBM, the intra-node link (NVLink, Infinity
    # Fabric, or PCIe), and the network between nodes in a typical cluster of that card.
    hbm_gbps: float = 2000.0
    intra_gbps: float = 300.0
    inter_gbps: float = 25.0
    # Achievable shares of the dense peak (sweeper.estimate.step_time): a large bf16 GEMM (cuBLAS), and
    # FlashAttention-2's / cuDNN's (FlashAttention-3-class) fused attention, forward + backward.
    gemm_share: float = 0.75
    flash2_share: float = 0.50
    fused_attention_share: float = 0.55
    # GPUs one NVLink fabric joins when more than a node (GB200/GB300 NVL72: 72); 0: the node.
    # Point-to-point and all-to-all traffic inside it runs at NVLink speed (sweeper.estimate.comm.link_gbps)
    nvlink_domain: int = 0
    # what the throughput model assumes of the card, not what the card is: left out of a sweep's
    # identity (sweeper.results.identity), so refining the model keeps existing results folders usable
    MODEL_FIELDS: ClassVar[tuple[str, ...]] = ("gemm_share", "flash2_share", "fused_attention_share", "nvlink_domain")

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s that MFU divides by for a run in `precision` (bf16 for float8 runs too, as torchtitan does)."""
        if precision == "fp32" and self.tf32_tflops is not None:
            return self.tf32_tflops * TERA
        return self.bf16_tflops * TERA

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_tflops is not None


# Memory: what nvidia-smi / rocm-smi report as total (MiB / 1024). Peaks: vendor data sheets, dense.
# Achieved shares: A100 large bf16 GEMMs ~250 of 312 TFLOP/s, FlashAttention-2 fwd+bwd ~190 of
# 312 (Dao 2023, arXiv:2307.08691, fig. 4-6); H100 SXM large GEMMs ~650-720 of 989 (Anthony et
# al. 2024, arXiv:2401.14489, GEMM sweeps), FlashAttention-2 "only 35 % utilization on H100"
# and FlashAttention-3 / cuDNN 1.5-2x that (Shah et al. 2024, arXiv:2407.08608, sec. 1 and 4.1).
# Blackwell and MI300X: no published GEMM sweep read here; the H100 shares are assumed.
GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("a100-40gb", 40.0, 312.0, 156.0, None, "A100 SXM4 40GB", 1555, 300, 25, 0.80, 0.60, 0.60),
        GPU("a100-80gb", 80.0, 312.0, 156.0, None, "A100 SXM4 80GB", 2039, 300, 25, 0.80, 0.60, 0.60),
        GPU("h100-sxm", 79.6, 989.4, 494.7, 1978.9, "H100 SXM5 80GB", 3350, 450, 50, 0.70, 0.35, 0.55),
        GPU("h100-pcie", 79.6, 756.0, 378.0, 1513.0, "H100 PCIe 80GB", 2000, 64, 25, 0.70, 0.35, 0.55),
        GPU("h200", 140.4, 989.4, 494.7, 1978.9, "H200 SXM 141GB", 4800, 450, 50, 0.72, 0.35, 0.55),
        GPU("b200", 179.1, 2250.0, 1100.0, 4500.0, "B200 (HGX) 180GB", 8000, 900, 50, 0.70, 0.30, 0.55),
        # B300 (HGX B300): 288 GB HBM3e at 8 TB/s, NVLink 5 (900 GB/s each way), ConnectX-8 800 Gb/s
        # per GPU; dense bf16/fp8 as B200 (Blackwell Ultra raises FP4 and the softmax units)
        GPU("b300", 268.2, 2250.0, 1100.0, 4500.0, "B300 (HGX) 288GB", 8000, 900, 100, 0.70, 0.30, 0.60),
        # GB200 / GB300 NVL72 (rack data sheets / 72: 180 PFLOPS dense bf16, 576 TB/s HBM, 13.4 / 20.7 TB
        # HBM3e): 2.5 PFLOPS bf16 and 5 fp8 dense per GPU. A "node" is a 4-GPU compute tray; trays of
        # one rack talk over NVLink 5 (900 GB/s per GPU), so 4 x 225 GB/s between trays reaches it
        # (past 72 GPUs the InfiniBand/ConnectX fabric is slower: not modelled)
        GPU("gb200", 184.0, 2500.0, 1250.0, 5000.0, "GB200 NVL72 186GB", 8000, 900, 225, 0.70, 0.30, 0.55, 72),
        GPU("gb300", 268.2, 2500.0, 1250.0, 5000.0, "GB300 NVL72 288GB", 8000, 900, 225, 0.70, 0.30, 0.60, 72),
        GPU("mi300x", 192.0, 1307.4, 653.7, 2614.9, "AMD Instinct MI300X", 5300, 448, 50, 0.55, 0.30, 0.40),
        GPU("l40s", 45.0, 362.1, 183.0, 733.0, "L40S 48GB", 864, 32, 12.5, 0.70, 0.40, 0.45),
        # Not a GPU: one CPU process per "device" in tests and the demo. The peak is a nominal
        # figure (2 cores x 3 GHz x 32 fp32 FLOP/cycle), so CPU MFUs are comparable with each
        # other, not with a GPU's.
        GPU("cpu", 4.0, 0.192, 0.192, None, "CPU process (nominal peak, tests and demo only)", 20, 5, 1),
    ]
}

GPU_ALIASES: dict[str, str] = {
    "a100": "a100-80gb",
    "a100-80g": "a100-80gb",
    "a100-40g": "a100-40gb",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "gb200-nvl72": "gb200",
    "gb300-nvl72": "gb300",
}


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def lookup_gpu(name: str) -> GPU | None:
    """The table entry for a GPU name (case-insensitive, a few common aliases), or None."""
    key = _key(name)
    return GPUS.get(GPU_ALIASES.get(key, key))


def alias_of(name: str) -> str | None:
    """The table name an alias stands for (`h100` -> `h100-sxm`); None for a table name or an unknown one."""
    return GPU_ALIASES.get(_key(name))


def known_gpus() -> str:
    """The GPU names a sweep file may give, the aliases with what each stands for, in one line."""
    aliases = ", ".join(f"{a} -> {name}" for a, name in GPU_ALIASES.items())
    return f"{', '.join(GPUS)}; aliases: {aliases}"


def gpu_matches(gpu: GPU, detected: str) -> bool:
    """Whether the driver's name of a card (e.g. "NVIDIA A100-SXM4-80GB") is the table's `gpu`.

    The family (a100, h100, mi300x...) must appear, and the memory size or the PCIe form where the
    table's name states one: an A100 40GB or an H100 PCIe has another MFU denominator.
    """
    words = "".join(c if c.isalnum() else " " for c in detected.lower()).split()
    text = " ".join(words)
    family, *rest = gpu.name.split("-")
    if gpu.name == "cpu":
        return not detected or detected == "cpu"
    if family not in words and family not in text.replace(" ", ""):
        return False
    for part in rest:
        if part.endswith("gb") and any(w.endswith("gb") for w in words) and part not in words:
            return False
        if part == "pcie" and "pcie" not in words:
            return False
        if part == "sxm" and "pcie" in words:
            return False
    return True

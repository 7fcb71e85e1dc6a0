"""torchtitan's loss, run as torchtitan runs it, against `trainers.torchtitan.torchtitan_loss_bytes`.

torchtitan's loss is `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`
(torchtitan/components/loss.py), with `pred` dropped before backward (`del pred` in train.py).
Eager, the peak is counted here by a dispatch mode that tracks every storage an op creates until
it dies; compiled (torchtitan compiles the loss with the model), what the graph keeps for
backward is read with saved-tensor hooks. Both run on CPU: the counts are tensor sizes, not a
card's allocator.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sweeper.layouts.layout import Layout
from sweeper.trainers.torchtitan import torchtitan_loss_bytes
from tests.conftest import make_sweep

TOKENS, VOCAB, HIDDEN = 256, 4096, 64


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that ops created and that are still alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st.data_ptr() not in self.live and st.nbytes():
                    self.live[st.data_ptr()] = st.nbytes()
                    self.now += st.nbytes()
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(st, self._free, st.data_ptr())
        return out


def loss_fn(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(pred.float(), labels)


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(HIDDEN, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    return x, w, torch.randint(0, VOCAB, (TOKENS,))


def model_bytes(compile: bool) -> tuple[float, float]:
    s = make_sweep(
        model={"layers": 2, "hidden": HIDDEN, "heads": 4, "ffn": 256, "vocab": VOCAB},
        seq_len=TOKENS,
        global_batch_size=8,
        space={"tp": [1]},
        memory={"recipe": "torchtitan"},
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm"},
    )
    kept, transient = torchtitan_loss_bytes(Layout(compile=compile).columns(s), s, 2)
    return float(np.asarray(kept)[0]), float(np.asarray(transient)[0])


def test_eager_loss_peaks_at_twelve_bytes_per_logit():
    x, w, labels = inputs()
    mode = LiveBytes()
    with mode:
        pred = x @ w
        loss = loss_fn(pred, labels)
        del pred
        loss.backward()
    logits = TOKENS * VOCAB
    small = TOKENS * HIDDEN * 2 + HIDDEN * VOCAB * 2 + 64 * 1024  # x's and w's gradients, scalars
    measured = mode.peak / logits
    kept, transient = model_bytes(compile=False)
    assert measured == pytest.approx(kept + transient, abs=small / logits)
    assert kept + transient == 12


def test_compiled_loss_keeps_only_the_16_bit_logits():
    x, w, labels = inputs()
    compiled = torch.compile(loss_fn)
    compiled(x @ w, labels).backward()  # compile outside the count
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    pred = x @ w
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compiled(pred, labels)
    full_size = {k: v for k, v in saved.items() if v >= TOKENS * VOCAB}
    assert list(full_size) == [pred.untyped_storage().data_ptr()]  # pred itself, nothing new
    kept, _ = model_bytes(compile=True)
    assert sum(full_size.values()) / (TOKENS * VOCAB) == kept == 2

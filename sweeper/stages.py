"""How a model's layers are split over pipeline stages, when the stages do not divide them evenly.

Pure. Megatron-LM and torchtitan both run uneven stages: a 60-layer model on 8 stages is 4
stages of 8 and 4 of 7. The first stage also holds the embedding and the last the output head
and loss, so the extra layers go to the middle stages first; both the memory model and the
built-in trainer read the split from here, so what is estimated is what runs.
"""

from __future__ import annotations


def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage (in pipeline order), as even as possible; the remainder goes to the middle.

    >>> split_layers(60, 8)
    (7, 8, 8, 8, 8, 7, 7, 7)
    >>> split_layers(32, 4)
    (8, 8, 8, 8)
    """
    if stages < 1 or layers < stages:
        raise ValueError(f"cannot split {layers} layers over {stages} stages (each stage needs a layer)")
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    for i in _middle_first(stages)[:extra]:
        counts[i] += 1
    return tuple(counts)


def _middle_first(stages: int) -> list[int]:
    """Stage indices, the ones holding neither the embedding nor the head first (in order), then last, then first."""
    if stages <= 2:
        return list(range(stages))[::-1]  # with two stages the head's side is lighter on activations
    return list(range(1, stages - 1)) + [stages - 1, 0]


def stage_bounds(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """[start, end) layer indices of every stage, in pipeline order."""
    out, start = [], 0
    for n in split_layers(layers, stages):
        out.append((start, start + n))
        start += n
    return tuple(out)

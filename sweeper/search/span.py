"""What a layout's step owes to the size it runs at, as features of the search's residual: the node
count and the share of the step the model prices as communication across nodes.

Within a sweep over several node counts, the same knobs at another size are another layout: its
data-parallel group spans more nodes, its pipeline sends leave the node, and the model's error there
is not the error measured at one node. With these features the residual's neighbourhoods are local
in size (one doubling of the nodes is as far as one knob value changed), while its linear term
carries a trend over sizes and over the share of the step that crosses nodes to the sizes nothing
measured yet: what one size taught of the communication between nodes, the others are priced by.
Pure numpy over the plan's columns.
"""

from __future__ import annotations

import numpy as np

from sweeper.estimate.predict import breakdown
from sweeper.plan.plan import Plan


def across_share(plan: Plan, rows: np.ndarray) -> np.ndarray:
    """The share of each layout's (uncalibrated) step at `rows` the model spends on communication
    across nodes: the data-parallel reduction where its group spans nodes, the pipeline sends where a
    stage fills a node (the model's own rule for their bandwidth); tensor, context and expert groups
    stay inside a node."""
    out = np.zeros(len(rows))
    gpus_per_node = plan.sweep.cluster.gpus_per_node
    for n in np.unique(plan.nodes[rows]):
        at = np.flatnonzero(plan.nodes[rows] == n)
        cols = {k: v[rows[at]] for k, v in plan.cols.items()}
        parts = breakdown(cols, plan.sweep_of(int(rows[at[0]])))
        inner = cols["dp"] * cols["tp"] * cols["cp"]
        across = np.where(inner > gpus_per_node, parts["dp_comm"], 0.0)
        across = across + np.where(inner >= gpus_per_node, parts["pp_comm"], 0.0)
        total = sum(v for k, v in parts.items() if k not in ("dp_hidden", "cp_hidden", "forward"))
        out[at] = np.clip(across / np.maximum(total, 1e-12), 0.0, 1.0)
    return out


def size_features(plan: Plan, rows: np.ndarray) -> np.ndarray:
    """Per layout at `rows`: log2 of its node count (one doubling, one unit) and its `across_share`."""
    nodes = np.log2(np.maximum(plan.nodes[rows].astype(float), 1.0))
    return np.column_stack([nodes, across_share(plan, rows)])

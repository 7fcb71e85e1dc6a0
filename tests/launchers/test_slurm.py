"""The SLURM launcher without SLURM: its profile's defaults and how many tasks a trial's job has.

The jobs themselves run in launchers/test_contract.py, end_to_end/test_slurm.py and
launchers/test_slurm_multinode.py against the session's real SLURM.
"""

from __future__ import annotations

import pytest

from sweeper.launchers.slurm import RESULT_GRACE_S, SlurmLauncher, SlurmProfile
from sweeper.launchers.task import node_rank, task_count, tasks_per_node
from tests.conftest import make_sweep


def test_a_job_is_cancelled_a_minute_after_its_result_unless_the_profile_says_otherwise():
    sweep = make_sweep(launcher={"kind": "slurm"})
    assert RESULT_GRACE_S == 60.0
    assert SlurmLauncher(SlurmProfile(kind="slurm"), sweep).result_grace_s == 60.0
    assert SlurmLauncher(SlurmProfile(kind="slurm", result_grace_s=7), sweep).result_grace_s == 7.0
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        SlurmProfile(kind="slurm", result_grace_s=-1)


@pytest.mark.parametrize(
    "kind, per_node",
    [("builtin", 8), ("megatron", 1), ("torchtitan", 1), ("command", 1)],
)
def test_tasks_of_a_job_one_per_device_for_the_builtin_trainer_one_per_node_for_others(kind: str, per_node: int):
    # submission starts these and re-attach waits for the same number (it waited for one per
    # device even when an external trainer's job had one per node)
    workload = {"kind": kind} if kind == "builtin" else {"kind": kind, "command": "run {flags}"}
    sweep = make_sweep(workload=workload)  # 8 nodes x 8 GPUs
    assert tasks_per_node(sweep) == per_node
    assert task_count(sweep) == 8 * per_node


@pytest.mark.parametrize(
    "env, node",
    [
        ({}, 0),
        ({"RANK": "5", "LOCAL_WORLD_SIZE": "2"}, 2),  # ranks are placed node by node
        ({"RANK": "3", "LOCAL_WORLD_SIZE": "1"}, 3),  # one task per node: the rank is the node
        ({"RANK": "5", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "4"}, 4),  # torchrun says it itself
    ],
)
def test_a_tasks_node_from_torchrun_style_variables(env: dict[str, str], node: int):
    assert node_rank(env) == node

"""The pod entry: node rank from the Indexed Job, torchrun command, exit-code mapping."""

from __future__ import annotations

from pathlib import Path

import pytest
from memfit_trainer.dist import node_rank_from_env, read_dist_env
from memfit_trainer.launch import exit_code_for, torchrun_argv
from trainer_support import make_plan


@pytest.mark.parametrize(
    ("environ", "rank"),
    [
        ({}, 0),
        ({"JOB_COMPLETION_INDEX": "3"}, 3),
        ({"JOB_COMPLETION_INDEX": "3", "PET_NODE_RANK": "1"}, 1),
        ({"JOB_COMPLETION_INDEX": "3", "GROUP_RANK": "2"}, 2),
        ({"NODE_RANK": "5"}, 5),
    ],
)
def test_node_rank(environ: dict[str, str], rank: int) -> None:
    assert node_rank_from_env(environ) == rank


def test_torchrun_environment_is_read() -> None:
    env = read_dist_env(
        {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
         "MASTER_ADDR": "job-train-0-0.job", "MASTER_PORT": "29500"}
    )  # fmt: skip
    assert (env.rank, env.local_rank, env.world_size, env.node_rank, env.under_launcher) == (5, 1, 8, 1, True)
    assert not read_dist_env({}).under_launcher


def test_torchrun_command_from_the_indexed_job() -> None:
    plan = make_plan().world(4, nodes=2).build()
    argv = torchrun_argv(
        plan,
        plan_path=Path("/etc/memfit/plan.json"),
        extra=[],
        environ={"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "job-train-0-0.job", "MASTER_PORT": "29500"},
    )
    joined = " ".join(argv)
    assert "--nnodes 2 --nproc-per-node 4 --node-rank 1" in joined
    assert "--master-addr job-train-0-0.job --master-port 29500" in joined
    assert joined.endswith("-m memfit_trainer.cli train --plan /etc/memfit/plan.json")


def test_pet_variables_are_left_to_torchrun() -> None:
    plan = make_plan().world(4, nodes=2).build()
    environ = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "a",
               "PET_MASTER_PORT": "29500"}  # fmt: skip
    argv = torchrun_argv(plan, plan_path=Path("p.json"), extra=[], environ=environ)
    assert not {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--standalone"} & set(argv)


@pytest.mark.parametrize(
    ("child", "message", "code"),
    [
        (1, {"reason": "CUDAOutOfMemory"}, 87),
        (1, {"reason": "HostOutOfMemory"}, 87),
        (1, {"reason": "InvalidPlan"}, 88),
        (1, {"reason": "TrainingError"}, 1),
        (1, None, 1),
        (-9, {"reason": "Surprise"}, -9),
    ],
)
def test_exit_code_follows_the_workers_message(child: int, message: dict[str, str] | None, code: int) -> None:
    assert exit_code_for(child, message) == code

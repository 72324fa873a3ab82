"""Every strategy the runtime accepts trains a tiny GPT, and the strategy is really applied.

World size 1: the full cross product (engine/stage/offload x precision x checkpointing x 8-bit), in
this process. World size 2: a pairwise-covering set (also over the optimizer kind) plus the cases
that compare sharding, all in one torchrun launch.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from memfit_trainer.dist import free_port
from trainer_support import (
    ALL_PRECISIONS,
    CHECKPOINTING,
    EIGHT_BIT,
    ENGINE_STAGE_OFFLOAD,
    OPTIMIZERS,
    PRECISIONS,
    PYTHON,
    REPO,
    PlanBuilder,
    case_id,
    cpu_cannot_run,
    pairwise,
    strategy_plan,
    subprocess_env,
)

LAYERS = 2  # TINY_GPT


def steps_for(plan: PlanBuilder) -> int:
    """4 steps; 6 under fp16, whose dynamic loss scaling skips the first steps (overflow at 2**16)."""
    return 6 if plan.wire()["precision"] == "fp16" else 4


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def assert_applied(plan: dict[str, Any], report: dict[str, Any]) -> None:
    """The run trained (loss fell) and the wrapped objects show the plan's strategy."""
    losses = [loss for _, loss in report["losses"]]
    assert len(losses) == plan["training"]["maxSteps"]
    assert losses[-1] < losses[0], losses
    facts = report["facts"]
    engine, stage, precision = plan["engine"], plan["zeroStage"], plan["precision"]
    assert facts["engine"] == engine
    assert report["checkpointed_modules"] == (0 if plan["activationCheckpointing"] == "none" else LAYERS)
    state_dtypes = set(facts["optimizer_state_dtypes"])
    if plan["optimizer8bit"]:
        assert "torch.uint8" in state_dtypes, facts
    else:
        assert "torch.uint8" not in state_dtypes and "torch.float32" in state_dtypes, facts
    offload = plan["offload"] == "cpu"
    if engine == "deepspeed":
        assert facts["zero_stage"] == stage
        assert facts["bf16"] == (precision == "bf16")
        assert facts["fp16"] == (precision == "fp16")
        assert facts["gradient_accumulation_steps"] == plan["gradientAccumulationSteps"]
        assert facts["train_micro_batch_size_per_gpu"] == plan["microBatchSize"]
        assert facts["offload_optimizer"] == ("cpu" if offload else None)
        assert facts["offload_param"] == ("cpu" if offload and stage == 3 else None)
        if offload and not plan["optimizer8bit"] and plan["training"]["optimizer"] != "sgd":
            assert facts["optimizer_class"] == "DeepSpeedCPUAdam"
        assert facts["param_dtypes"] == [f"torch.{DTYPES[precision]}"]
    elif engine == "fsdp":
        assert facts["reshard_after_forward"] == (stage == 3)
        assert facts["mp_param_dtype"] == (None if precision == "fp32" else f"torch.{DTYPES[precision]}")
        assert facts["grad_scaler"] == (precision == "fp16")
        assert facts["offload_policy"] == ("CPUOffloadPolicy" if offload else "OffloadPolicy")
        assert facts["optimizer_state_devices"] == ["cpu"]
    else:
        assert facts["autocast_dtype"] == (None if precision == "fp32" else f"torch.{DTYPES[precision]}")
        assert facts["grad_scaler"] == (precision == "fp16")
    if plan["optimizer8bit"]:
        assert facts["optimizer_class"] in {"AdamW8bit", "Adam8bit", "SGD8bit", "LocalShardOptimizer"}


# DDP and FSDP runs are cheap: their full cross product. DeepSpeed (1-5 s per engine start on 2
# cores): pairwise over its strategies, precision, checkpointing, 8-bit and optimizer kind, unless
# MEMFIT_FULL_MATRIX=1 asks for its full cross product too.
FULL = os.environ.get("MEMFIT_FULL_MATRIX") == "1"
DEEPSPEED = [s for s in ENGINE_STAGE_OFFLOAD if s[0] == "deepspeed"]
WORLD1 = [
    strategy_plan(s, p, c, b)
    for s, p, c, b in itertools.product(ENGINE_STAGE_OFFLOAD, PRECISIONS, CHECKPOINTING, EIGHT_BIT)
    if FULL or s[0] != "deepspeed"
] + ([] if FULL else [
    strategy_plan(*combo) for combo in pairwise([DEEPSPEED, ALL_PRECISIONS, CHECKPOINTING, EIGHT_BIT, OPTIMIZERS])
])  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("plan", WORLD1, ids=[case_id(p) for p in WORLD1])
def test_world1_strategy_trains_and_applies(plan: PlanBuilder, train_local: Callable[..., Any]) -> None:
    if reason := cpu_cannot_run(plan):
        pytest.skip(reason)
    from dataclasses import asdict

    plan = plan.steps(steps_for(plan))
    assert_applied(plan.wire(), asdict(train_local(plan)))


# Pairwise over (engine/stage/offload, precision incl. fp16, checkpointing, 8-bit, optimizer), plus the
# same-precision pairs whose parameter bytes are compared.
WORLD2 = [strategy_plan(*combo).world(2) for combo in pairwise(
    [ENGINE_STAGE_OFFLOAD, ALL_PRECISIONS, CHECKPOINTING, EIGHT_BIT, OPTIMIZERS]
)] + [
    strategy_plan(("ddp", 0, "none"), "fp32", "none", False).world(2),
    strategy_plan(("deepspeed", 0, "none"), "fp32", "none", False).world(2),
    strategy_plan(("deepspeed", 3, "none"), "fp32", "none", False).world(2),
    strategy_plan(("fsdp", 3, "none"), "fp32", "none", False).world(2),
]  # fmt: skip
WORLD2 = list({case_id(p): p for p in WORLD2}.values())


@pytest.fixture(scope="module")
def world2_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, dict[str, Any]]]:
    """Run every world-2 case in one 2-rank torchrun launch; reports by case id and rank."""
    tmp = tmp_path_factory.mktemp("world2")
    cases = [{"id": case_id(p), "plan": p.steps(steps_for(p)).wire()} for p in WORLD2]
    (tmp / "cases.json").write_text(json.dumps(cases))
    command = [
        PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(Path(__file__).with_name("matrix_worker.py")),
        str(tmp / "cases.json"), str(tmp / "out"),
    ]  # fmt: skip
    proc = subprocess.run(
        command, env=subprocess_env(tmp), cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {
        c["id"]: {r: json.loads((tmp / "out" / c["id"] / f"rank-{r}.json").read_text()) for r in (0, 1)}
        for c in cases
    }


def test_world2_cases_cover_every_pair() -> None:
    ids = {case_id(p) for p in WORLD2}
    assert len(ids) >= len(ENGINE_STAGE_OFFLOAD) * len(OPTIMIZERS)
    for strategy, precision in itertools.product(ENGINE_STAGE_OFFLOAD, ALL_PRECISIONS):
        prefix = f"{strategy[0]}{strategy[1]}-{precision}-"
        assert any(i.startswith(prefix) and f"-{strategy[2]}" in i for i in ids), (strategy, precision)


@pytest.mark.slow
@pytest.mark.parametrize("plan", WORLD2, ids=[case_id(p) for p in WORLD2])
def test_world2_strategy_trains_and_applies(plan: PlanBuilder, world2_reports: dict[str, Any]) -> None:
    if reason := cpu_cannot_run(plan):
        pytest.skip(reason)
    reports = world2_reports[case_id(plan)]
    for rank in (0, 1):
        assert "error" not in reports[rank], reports[rank].get("traceback")
        assert reports[rank]["world_size"] == 2
        assert_applied(plan.steps(steps_for(plan)).wire(), reports[rank])
    # The loss is averaged over ranks, so both ranks report the same trajectory.
    assert reports[0]["losses"] == reports[1]["losses"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sharded", "replicated"),
    [
        ("deepspeed3-fp32-none-none-w2", "deepspeed0-fp32-none-none-w2"),
        ("fsdp3-fp32-none-none-w2", "ddp0-fp32-none-none-w2"),
    ],
    ids=["zero3 vs zero0", "fsdp full shard vs ddp"],
)
def test_world2_sharding_halves_parameter_bytes(
    sharded: str, replicated: str, world2_reports: dict[str, Any]
) -> None:
    for rank in (0, 1):
        full = world2_reports[replicated][rank]["facts"]["param_bytes_local"]
        shard = world2_reports[sharded][rank]["facts"]["param_bytes_local"]
        assert shard == pytest.approx(full / 2, rel=0.02), (shard, full)

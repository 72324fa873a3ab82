"""Checkpoint and resume: a killed run continues from its checkpoint with the same steps, data and losses;
a re-planned run resumes across engines and world sizes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_support import PlanBuilder, losses, make_plan, run_cli

STEPS = 6
EVERY = 2
KILL_AT = 5  # after the checkpoint of step 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("plan", "reference"),
    [
        # DeepSpeed's format and DCP (with per-rank 8-bit state), both through the pod's launcher at world
        # size 2; DCP at world size 1 is covered in-process below.
        pytest.param(
            make_plan().deepspeed(3).world(2).batch(1, 2), make_plan().ddp().batch(1, 4), id="zero3-w2"
        ),
        pytest.param(
            make_plan().fsdp(2).eight_bit().world(2).batch(2, 1),
            make_plan().ddp().eight_bit().batch(2, 2),
            id="fsdp2-8bit-w2",
        ),
    ],
)
def test_killed_run_resumes_from_its_checkpoint(
    plan: PlanBuilder, reference: PlanBuilder, tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    # The uninterrupted trajectory, in this process at world size 1: same global batch, same samples
    # per step (data is keyed by sample index, not by rank), so the same losses.
    expected = [loss for _, loss in train_local(reference.steps(STEPS)).losses]
    plan = plan.steps(STEPS, every=EVERY).checkpoint_dir(tmp_path / "ckpt")

    killed = run_cli(plan, tmp_path, env={"MEMFIT_INJECT_KILL_AT_STEP": str(KILL_AT)})
    assert killed.returncode != 0, killed.output[-2000:]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000002", "step-00000004"]

    resumed = run_cli(plan, tmp_path)
    assert resumed.returncode == 0, resumed.output[-4000:]
    message = resumed.termination
    assert message is not None
    assert message["reason"] == "Completed"
    assert message["steps"] == STEPS and message["resumedFromStep"] == 4
    assert message["peakBytes"] > 0
    for report in resumed.reports.values():
        assert report["resumed_natively"] is True
        assert [step for step, _ in report["losses"]] == [5, 6]
        assert losses(report) == pytest.approx(expected[4:], rel=1e-4)
        assert message["finalLoss"] == pytest.approx(expected[-1], rel=1e-4)
    # Retention keeps the newest two complete checkpoints.
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000004", "step-00000006"]
    assert (tmp_path / "ckpt" / "latest").read_text() == "step-00000006"


def _first_leg(plan: PlanBuilder, folder: Path, train_local: Callable[..., Any]) -> list[float]:
    result = train_local(plan.steps(4, every=EVERY).checkpoint_dir(folder), checkpoint_dir=folder)
    return [loss for _, loss in result.losses]


def test_replan_to_another_engine_resumes_natively_through_dcp(
    tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    """DDP -> FSDP2 with CPU offload: DCP restores weights and AdamW state, so the losses continue exactly."""
    expected = [loss for _, loss in train_local(make_plan().ddp().steps(STEPS)).losses]
    folder = tmp_path / "ckpt"
    _first_leg(make_plan().ddp(), folder, train_local)
    result = train_local(
        make_plan().fsdp(3).offload("cpu").batch(1, 4).steps(STEPS, EVERY), checkpoint_dir=folder
    )
    assert result.resumed_from_step == 4 and result.resumed_natively is True
    assert [loss for _, loss in result.losses] == pytest.approx(expected[4:], rel=1e-5)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(make_plan().deepspeed(2).bf16(), make_plan().fsdp(3), id="zero2-bf16 to fsdp3"),
        pytest.param(
            make_plan().fsdp(2), make_plan().deepspeed(3).offload("cpu"), id="fsdp2 to zero3-offload"
        ),
        pytest.param(make_plan().deepspeed(0), make_plan().deepspeed(3), id="zero0 to zero3"),
    ],
)
def test_replan_across_formats_resumes_the_weights(
    first: PlanBuilder, second: PlanBuilder, tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    """A checkpoint the new strategy cannot restore natively: weights and step carry over, optimizer restarts.

    The first resumed loss is computed before any update, with exactly the loaded weights, so it equals
    the uninterrupted run's loss at that step (up to the precision the checkpoint was written in)."""
    uninterrupted = [loss for _, loss in train_local(first.steps(STEPS)).losses]
    folder = tmp_path / "ckpt"
    _first_leg(first, folder, train_local)
    result = train_local(second.steps(STEPS, EVERY), checkpoint_dir=folder)
    assert result.resumed_from_step == 4 and result.resumed_natively is False
    assert [step for step, _ in result.losses] == [5, 6]
    assert result.losses[0][1] == pytest.approx(uninterrupted[4], rel=2e-3)
    assert result.losses[0][1] < uninterrupted[0] - 0.2  # far from freshly initialised weights

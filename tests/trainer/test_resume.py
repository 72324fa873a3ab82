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


@pytest.mark.parametrize(
    ("planned", "pinned", "saved"),
    [(2, None, [2, 4, 5]), (2, 3, [3, 5])],
    ids=["the plan's chosen interval", "the job's pinned interval wins"],
)
def test_the_trainer_saves_at_the_plans_interval(
    planned: int, pinned: int | None, saved: list[int], tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    folder = tmp_path / "ckpt"
    plan = make_plan().ddp().steps(5).planned_every(planned, pinned=pinned).checkpoint_dir(folder)
    assert train_local(plan, checkpoint_dir=folder).checkpoints_saved == saved


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


@pytest.fixture(scope="module")
def finetune_volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from memfit_testbed.finetune_data import make_volumes

    return make_volumes(tmp_path_factory.mktemp("volumes"))


def test_resumed_finetune_keeps_the_first_attempts_initial_eval_loss(
    finetune_volumes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train_local: Callable[..., Any],
    world1: Any,
) -> None:
    """The "before" figure of memfit_training.json is the eval loss the first attempt measured before any
    training (carried by the checkpoint), not the resumed attempt's; the Completed message carries the
    eval loss after the last step."""
    import json

    from memfit_testbed.finetune_data import data, problem
    from memfit_trainer.checkpoints import find_latest
    from memfit_trainer.worker import completed_message

    monkeypatch.setenv("MEMFIT_VOLUMES_DIR", str(finetune_volumes))
    plan = make_plan().problem(problem()).data(data(evalEverySteps=2)).learning_rate(1e-2)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    first = train_local(plan.steps(2, every=2), checkpoint_dir=ckpt, output_dir=out)
    before = first.eval_losses[0]
    assert before[0] == 0 and (first.initial_eval_step, first.initial_eval_loss) == before
    meta = find_latest(ckpt)
    assert meta is not None and (meta[1].initial_eval_step, meta[1].initial_eval_loss) == before

    second = train_local(plan.steps(4, every=2), checkpoint_dir=ckpt, output_dir=out)
    assert second.resumed_from_step == 2 and [step for step, _ in second.eval_losses] == [2, 4]
    summary = json.loads((out / "memfit_training.json").read_text())
    assert (summary["initial_eval_step"], summary["initial_eval_loss"]) == before
    assert summary["resumed_from_step"] == 2
    assert summary["final_eval_loss"] == second.eval_losses[-1][1] < before[1] - 0.1  # it learned since step 0
    assert summary["eval_losses"][0][1] < before[1]  # the resumed attempt's first eval is no "before" figure
    wire = completed_message(second, world1).to_wire()
    assert wire["evalLoss"] == round(second.eval_losses[-1][1], 6) and wire["steps"] == 4


def test_a_checkpoint_of_an_older_trainer_has_no_initial_eval(tmp_path: Path) -> None:
    import json

    from memfit_trainer.checkpoints import read_meta

    folder = tmp_path / "step-00000002"
    folder.mkdir()
    older = {"step": 2, "format": "dcp", "engine": "ddp", "zero_stage": 0, "world_size": 1, "precision": "fp32",
             "offload": "none", "optimizer": "adamw", "optimizer8bit": False, "loss": 1.5, "samples": 8, "seed": 0}
    (folder / "memfit.json").write_text(json.dumps(older))
    meta = read_meta(folder)
    assert meta is not None and meta.step == 2
    assert (meta.initial_eval_step, meta.initial_eval_loss) == (None, None)

"""Optimizer step in backward: the same updates as the step after backward, no gradient left after backward,
and checkpoints that resume exactly (also from a checkpoint of the usual optimizer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_support import PlanBuilder, make_plan

STEPS = 5
ONE_RANK = make_plan().ddp().batch(4, 1)


def _curve(result: Any) -> list[float]:
    return [loss for _, loss in result.losses]


@pytest.mark.parametrize(
    "plan",
    [
        pytest.param(ONE_RANK, id="fp32 adamw"),
        pytest.param(ONE_RANK.optimizer("sgd").learning_rate(0.1), id="fp32 sgd"),
        pytest.param(ONE_RANK.precision("bf16-pure"), id="bf16-pure adamw"),
        pytest.param(ONE_RANK.precision("bf16"), id="bf16 autocast adamw"),
        pytest.param(ONE_RANK.eight_bit(), id="8-bit adamw"),
        pytest.param(ONE_RANK.precision("bf16-pure").eight_bit(), id="bf16-pure 8-bit adamw"),
    ],
)
def test_stepping_in_backward_follows_the_usual_loss_curve(plan: PlanBuilder,
                                                           train_local: Callable[..., Any]) -> None:
    """Per-parameter optimizers of the same kind make the same updates: the same losses (fp32 to 1e-5)."""
    usual = train_local(plan.steps(STEPS))
    fused = train_local(plan.in_backward().steps(STEPS))
    assert _curve(fused) == pytest.approx(_curve(usual), rel=1e-5)
    assert _curve(usual)[-1] < _curve(usual)[0]
    facts = fused.facts
    tensors = 29  # the tiny GPT's parameter tensors
    assert facts["optimizer_in_backward"] is True and usual.facts["optimizer_in_backward"] is False
    assert facts["optimizers_in_backward"] == tensors
    assert facts["optimizer_inner_class"] == usual.facts["optimizer_class"]
    assert facts["steps_in_backward"] == tensors * STEPS
    assert facts["optimizer_state_bytes"] == usual.facts["optimizer_state_bytes"]


def test_no_gradient_outlives_backward(world1: Any) -> None:
    """After a micro-step's backward every parameter has stepped and holds no gradient; optimizer_step has
    nothing left to do."""
    import torch
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies import make_runner

    plan = ONE_RANK.in_backward().build()
    problem = build_problem(plan.problem)
    before = {name: p.detach().clone() for name, p in problem.model.named_parameters()}
    runner = make_runner(plan=plan, problem=problem, device=torch.device("cpu"), world_size=1)
    runner.micro_step(problem.make_batch(BatchKey(seed=0, step=1, sample_start=0, samples=4)), last=True)
    params = dict(problem.model.named_parameters())
    assert all(p.grad is None for p in params.values())
    assert all(not torch.equal(params[name], value) for name, value in before.items())
    stepped = {name: p.detach().clone() for name, p in params.items()}
    runner.optimizer_step()
    assert all(torch.equal(params[name], value) for name, value in stepped.items())


@pytest.mark.parametrize(
    ("first", "second"),
    [(True, True), (False, True), (True, False)],
    ids=["in backward both times", "usual checkpoint resumed in backward", "in-backward checkpoint resumed usually"],
)
def test_stepping_in_backward_resumes_exactly(first: bool, second: bool, tmp_path: Path,
                                              train_local: Callable[..., Any]) -> None:
    """DCP saves the per-parameter optimizers' state keyed by parameter name in one param group, as one
    optimizer's: a run resumed from step 4 continues the uninterrupted losses, whichever way either leg steps."""
    expected = _curve(train_local(ONE_RANK.steps(6)))
    folder = tmp_path / "ckpt"
    train_local(ONE_RANK.in_backward(first).steps(4, every=2).checkpoint_dir(folder), checkpoint_dir=folder)
    resumed = train_local(ONE_RANK.in_backward(second).steps(6, every=2).checkpoint_dir(folder),
                          checkpoint_dir=folder)
    assert resumed.resumed_from_step == 4 and resumed.resumed_natively is True
    assert _curve(resumed) == pytest.approx(expected[4:], rel=1e-5)


def test_the_wrapper_state_dict_round_trips() -> None:
    """state_dict()/load_state_dict() keyed by parameter name restore every per-parameter optimizer."""
    import torch
    from memfit_trainer.optim_in_backward import OptimizerInBackward

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    def make(params: list[torch.nn.Parameter], _index: int) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=0.1)

    trained, fresh = model(), model()
    source = OptimizerInBackward(trained.named_parameters(), make)
    trained(torch.ones(2, 4)).sum().backward()
    target = OptimizerInBackward(fresh.named_parameters(), make)
    target.load_state_dict(source.state_dict())
    assert sorted(target.state_dict()) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    for name, optimizer in source.optimizers.items():
        (ours,), (theirs,) = optimizer.state.values(), target.optimizers[name].state.values()
        assert torch.equal(ours["exp_avg"], theirs["exp_avg"]) and float(theirs["step"]) == 1
    with pytest.raises(KeyError, match=r"0\.bias"):
        target.load_state_dict({k: v for k, v in source.state_dict().items() if k != "0.bias"})


@pytest.mark.parametrize(
    ("plan", "fragment"),
    [
        pytest.param(ONE_RANK.batch(2, 2), "gradientAccumulationSteps 2", id="accumulation"),
        pytest.param(ONE_RANK.fsdp(3), "with fsdp", id="fsdp"),
        pytest.param(ONE_RANK.precision("fp16"), "with fp16", id="fp16"),
    ],
)
def test_plans_it_cannot_apply_are_refused(plan: PlanBuilder, fragment: str) -> None:
    from memfit_trainer.plan_check import RuntimeFacts, plan_problems

    reasons = plan_problems(plan.in_backward().build(), RuntimeFacts(world_size=1, cuda=False))
    assert any(fragment in reason for reason in reasons), reasons

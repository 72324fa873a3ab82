"""bf16-pure: stochastic rounding is unbiased and seeded, the bf16 optimizers do torch's arithmetic, and DDP and
FSDP2 train with bf16 weights, gradients and optimizer state (and resume exactly)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_support import PlanBuilder, losses, make_plan, run_cli

STEPS = 6
PURE = make_plan().precision("bf16-pure").batch(4, 1)


def _neighbours(value: float) -> tuple[float, float]:
    """The bf16 values either side of an fp32 value that bf16 cannot represent."""
    import torch

    bits = int(torch.tensor(value, dtype=torch.float32).view(torch.int32)) & -65536
    near_zero, away = (float(torch.tensor(b, dtype=torch.int32).view(torch.float32)) for b in (bits, bits + 65536))
    return (min(near_zero, away), max(near_zero, away))


@pytest.mark.parametrize("value", [1.0 + 2**-9, -(3.0 + 2**-8), 2**-100 * (1 + 2**-9), 100.375], ids=str)
def test_stochastic_rounding_is_unbiased(value: float) -> None:
    """A value a quarter (or three quarters) of the way between two bf16 neighbours rounds to one of them, each
    with the probability of its nearness: the mean of many roundings is the value (round-to-nearest's mean is a
    neighbour)."""
    import torch
    from memfit_trainer.stochastic_rounding import stochastic_round

    x = torch.full((200_000,), value, dtype=torch.float32)
    rounded = stochastic_round(x, torch.Generator().manual_seed(1))
    low, high = _neighbours(float(x[0]))
    ulp = high - low
    assert rounded.dtype == torch.bfloat16
    assert set(rounded.float().unique().tolist()) == {low, high}
    assert abs(float(rounded.double().mean()) - float(x[0])) < 0.01 * ulp
    assert abs(float(x.to(torch.bfloat16).double().mean()) - float(x[0])) > 0.1 * ulp  # nearest is biased


def test_stochastic_rounding_is_deterministic_per_seed() -> None:
    import torch
    from memfit_trainer.stochastic_rounding import stochastic_round

    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))

    def rounded(seed: int) -> Any:
        return stochastic_round(x, torch.Generator().manual_seed(seed))

    assert torch.equal(rounded(7), rounded(7))
    assert not torch.equal(rounded(7), rounded(8))
    exact = x.to(torch.bfloat16)
    assert torch.equal(stochastic_round(exact, torch.Generator().manual_seed(3)), exact)  # bf16 values stay


@pytest.mark.parametrize("kind", ["adamw", "adam", "sgd"])
@pytest.mark.parametrize("slice_elements", [1 << 24, 1000], ids=["whole tensor", "in slices"])
def test_a_bf16_step_is_torchs_step_stochastically_rounded(kind: str, slice_elements: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """From the same bf16 weights and gradient, each new weight is one of the two bf16 neighbours of torch's
    fp32 result (both directions occur), and the state is torch's state rounded to nearest; also when the
    step goes through the tensor slice by slice (a large tensor's fp32 temporaries stay bounded)."""
    import torch
    from memfit.api.job import OptimizerKind, TrainingSpec
    from memfit_trainer import stochastic_rounding
    from memfit_trainer.optim import bf16_pure_optimizer, torch_optimizer

    monkeypatch.setattr(stochastic_rounding, "STEP_SLICE", slice_elements)
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(4096, generator=gen).to(torch.bfloat16)
    grad = torch.randn(4096, generator=gen).to(torch.bfloat16)
    training = TrainingSpec(optimizer=OptimizerKind(kind), learning_rate=1e-2)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.float())
    ours_opt, theirs_opt = bf16_pure_optimizer([ours], training), torch_optimizer([theirs], training)
    ours.grad, theirs.grad = grad.clone(), grad.float()
    ours_opt.step()
    theirs_opt.step()

    bits = theirs.detach().view(torch.int32)
    toward_zero = (bits & -65536).view(torch.float32)  # the bf16 neighbour nearer zero
    away = torch.where((bits & 0xFFFF) != 0, (bits & -65536) + 65536, bits & -65536).view(torch.float32)
    result = ours.detach().float()
    assert ours.dtype == torch.bfloat16
    assert bool(((result == toward_zero) | (result == away)).all())
    assert 0.2 < float((result == away)[toward_zero != away].float().mean()) < 0.8
    for key, value in theirs_opt.state[theirs].items():
        if key != "step":
            assert ours_opt.state[ours][key].dtype == torch.bfloat16, key
            assert torch.equal(ours_opt.state[ours][key], value.to(torch.bfloat16)), key


def test_bf16_pure_ddp_trains_in_bf16(world1: Any, train_local: Callable[..., Any]) -> None:
    """No autocast, no scaler; weights, gradients and both Adam moments bf16 (only the step counters fp32)."""
    import torch
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies import make_runner

    result = train_local(PURE.ddp().steps(STEPS))
    curve = [loss for _, loss in result.losses]
    assert curve[-1] < curve[0] - 0.1, curve
    facts = result.facts
    assert facts["param_dtypes"] == ["torch.bfloat16"] and facts["autocast_dtype"] is None
    assert facts["grad_scaler"] is False and facts["optimizer_class"] == "Bf16AdamW"
    assert facts["optimizer_state_dtypes"] == ["torch.bfloat16", "torch.float32"]
    params = facts["param_bytes_local"] // 2
    tensors = 29  # the tiny GPT's parameter tensors: one fp32 step counter each
    assert facts["optimizer_state_bytes"] == 2 * 2 * params + 4 * tensors

    plan = PURE.ddp().build()
    problem = build_problem(plan.problem)
    runner = make_runner(plan=plan, problem=problem, device=torch.device("cpu"), world_size=1)
    runner.micro_step(problem.make_batch(BatchKey(seed=0, step=1, sample_start=0, samples=4)), last=True)
    assert {p.grad.dtype for p in problem.model.parameters()} == {torch.bfloat16}


def test_bf16_pure_resumes_exactly(tmp_path: Path, train_local: Callable[..., Any]) -> None:
    """The rounding noise is keyed by (seed, step, tensor): a run resumed from its step-4 checkpoint continues
    the uninterrupted run's losses exactly."""
    expected = [loss for _, loss in train_local(PURE.ddp().steps(STEPS)).losses]
    folder = tmp_path / "ckpt"
    train_local(PURE.ddp().steps(4, every=2).checkpoint_dir(folder), checkpoint_dir=folder)
    resumed = train_local(PURE.ddp().steps(STEPS, every=2).checkpoint_dir(folder), checkpoint_dir=folder)
    assert resumed.resumed_from_step == 4 and resumed.resumed_natively is True
    assert [loss for _, loss in resumed.losses] == expected[4:]


@pytest.mark.parametrize(("first", "second"), [("bf16-pure", "fp32"), ("fp32", "bf16-pure")])
def test_a_replan_across_bf16_pure_resumes_the_weights(first: str, second: str, tmp_path: Path,
                                                      train_local: Callable[..., Any]) -> None:
    """Another optimizer class: the weights carry over (cast), the optimizer restarts."""
    plan = make_plan().ddp().batch(4, 1)
    uninterrupted = [loss for _, loss in train_local(plan.precision(first).steps(STEPS)).losses]
    folder = tmp_path / "ckpt"
    train_local(plan.precision(first).steps(4, every=2).checkpoint_dir(folder), checkpoint_dir=folder)
    resumed = train_local(plan.precision(second).steps(STEPS, every=2).checkpoint_dir(folder), checkpoint_dir=folder)
    assert resumed.resumed_from_step == 4 and resumed.resumed_natively is False
    assert resumed.losses[0][1] == pytest.approx(uninterrupted[4], rel=2e-3)
    assert resumed.losses[0][1] < uninterrupted[0] - 0.2


def test_bf16_pure_fsdp_on_one_rank_follows_ddp(train_local: Callable[..., Any]) -> None:
    """FSDP2 with a plain MixedPrecisionPolicy on bf16 weights: on one rank, the same updates as DDP."""
    ddp = [loss for _, loss in train_local(PURE.ddp().steps(3)).losses]
    fsdp = train_local(PURE.fsdp(3).steps(3))
    assert [loss for _, loss in fsdp.losses] == ddp
    assert fsdp.facts["mp_param_dtype"] is None and fsdp.facts["param_dtypes"] == ["torch.bfloat16"]


@pytest.mark.parametrize("plan", [PURE.ddp(), PURE.fsdp(3)], ids=["ddp", "fsdp3"])
def test_bf16_pure_with_an_8bit_optimizer_trains(plan: PlanBuilder, train_local: Callable[..., Any]) -> None:
    """bitsandbytes' 8-bit AdamW updates the bf16 weights in place (its state 8-bit, fp32 under 4096 elements)."""
    result = train_local(plan.eight_bit().steps(STEPS))
    curve = [loss for _, loss in result.losses]
    assert curve[-1] < curve[0] - 0.1, curve
    assert result.facts["param_dtypes"] == ["torch.bfloat16"]
    assert "torch.uint8" in result.facts["optimizer_state_dtypes"]


@pytest.mark.slow
def test_bf16_pure_fsdp_trains_on_two_ranks(tmp_path: Path) -> None:
    """Two gloo ranks under torchrun: bf16 shards, bf16 reduce-scatter, bf16 state; the loss falls."""
    run = run_cli(PURE.fsdp(3).batch(2, 1).world(2).steps(STEPS), tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    assert sorted(run.reports) == [0, 1]
    for report in run.reports.values():
        facts = report["facts"]
        assert facts["param_dtypes"] == ["torch.bfloat16"] and facts["mp_reduce_dtype"] is None
        assert facts["optimizer_state_dtypes"] == ["torch.bfloat16", "torch.float32"]
        curve = losses(report)
        assert curve[-1] < curve[0] - 0.1, curve
    assert losses(run.reports[0]) == losses(run.reports[1])  # the all-reduced loss


@pytest.mark.parametrize(
    ("plan", "cuda_bf16", "fragment"),
    [
        pytest.param(PURE.deepspeed(2), True, "with deepspeed", id="deepspeed"),
        pytest.param(PURE.fsdp(3).offload("cpu"), True, "offload cpu", id="offload"),
        pytest.param(PURE.peft("lora"), True, "with lora", id="lora"),
        pytest.param(PURE, False, "without bf16 support", id="GPU without bf16"),
    ],
)
def test_plans_bf16_pure_cannot_run_are_refused(plan: PlanBuilder, cuda_bf16: bool, fragment: str) -> None:
    from memfit_trainer.plan_check import RuntimeFacts, plan_problems

    reasons = plan_problems(plan.build(), RuntimeFacts(world_size=1, cuda=True, bf16_supported=cuda_bf16))
    assert any(fragment in reason for reason in reasons), reasons

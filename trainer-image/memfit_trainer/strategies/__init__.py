"""Engine adapters that apply a Plan: DDP, FSDP2 and DeepSpeed, plus activation checkpointing."""

from __future__ import annotations

import torch
from memfit.api.common import Engine
from memfit.api.plan import Plan

from memfit_trainer.activation_offload import apply_activation_offload
from memfit_trainer.chunked_loss import apply_chunked_loss
from memfit_trainer.problems import TrainingProblem
from memfit_trainer.strategies.base import Runner

CHECKPOINT_FORMATS = {Engine.DDP: "dcp", Engine.FSDP: "dcp", Engine.DEEPSPEED: "deepspeed"}


def make_runner(
    *, plan: Plan, problem: TrainingProblem, device: torch.device, world_size: int, seed: int = 0
) -> Runner:
    """Wrap the problem's model for the plan's engine (imports only that engine); `seed` seeds bf16-pure's
    stochastic rounding. A plan with `chunked_loss` gets the problem's chunked loss here, and one with
    `activation_offload` its blocks' saved-tensor hooks (memfit_trainer.activation_offload), under every engine."""
    if plan.chunked_loss:
        problem = apply_chunked_loss(problem)
    if plan.activation_offload:
        apply_activation_offload(problem.model, problem.blocks)
    if plan.engine == Engine.DEEPSPEED:
        from memfit_trainer.strategies.deepspeed import DeepSpeedRunner

        return DeepSpeedRunner(plan=plan, problem=problem, device=device)
    if plan.engine == Engine.FSDP:
        from memfit_trainer.strategies.fsdp import FsdpRunner

        return FsdpRunner(plan=plan, problem=problem, device=device, world_size=world_size, seed=seed)
    if plan.engine == Engine.DDP:
        from memfit_trainer.strategies.ddp import DdpRunner

        return DdpRunner(plan=plan, problem=problem, device=device, world_size=world_size, seed=seed)
    raise ValueError(f"unknown engine {plan.engine.value!r}")

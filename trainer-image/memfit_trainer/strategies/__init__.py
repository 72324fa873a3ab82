"""Engine adapters that apply a Plan: DDP, FSDP2 and DeepSpeed, plus activation checkpointing."""

from __future__ import annotations

import torch
from memfit.api.common import Engine
from memfit.api.plan import Plan

from memfit_trainer.problems import TrainingProblem
from memfit_trainer.strategies.base import Runner

CHECKPOINT_FORMATS = {Engine.DDP: "dcp", Engine.FSDP: "dcp", Engine.DEEPSPEED: "deepspeed"}


def make_runner(*, plan: Plan, problem: TrainingProblem, device: torch.device, world_size: int) -> Runner:
    """Wrap the problem's model for the plan's engine (imports only that engine)."""
    if plan.engine == Engine.DEEPSPEED:
        from memfit_trainer.strategies.deepspeed import DeepSpeedRunner

        return DeepSpeedRunner(plan=plan, problem=problem, device=device)
    if plan.engine == Engine.FSDP:
        from memfit_trainer.strategies.fsdp import FsdpRunner

        return FsdpRunner(plan=plan, problem=problem, device=device, world_size=world_size)
    if plan.engine == Engine.DDP:
        from memfit_trainer.strategies.ddp import DdpRunner

        return DdpRunner(plan=plan, problem=problem, device=device, world_size=world_size)
    raise ValueError(f"unknown engine {plan.engine.value!r}")

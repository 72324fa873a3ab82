"""DDP: replicated model and optimizer; autocast for bf16/fp16 (fp16 with a GradScaler), or bf16-pure: the
model itself cast to bf16, no autocast, a stochastically rounding bf16 optimizer or the 8-bit one
(memfit_trainer.optim).

At world size 1 there is nothing to all-reduce, so the model is not wrapped: DDP's reducer would
only add buckets. At world size 2+ the wrapper uses `gradient_as_bucket_view=True`: gradients are
views into the reducer's flat buckets instead of a second 4 B/parameter copy (torch DDP docs,
"gradient_as_bucket_view ... saves a memory size equal to the total gradients size"), and
`find_unused_parameters` only when the profile found parameters that get no gradient
(`Plan.find_unused_parameters`): the graph walk it adds costs time on every step.

`plan.optimizer_in_backward` (one rank, no accumulation, not fp16): one optimizer per parameter, stepped
in backward as each gradient is ready (memfit_trainer.optim_in_backward); `optimizer_step` then has
nothing left to apply.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from memfit.api.common import Precision
from memfit.api.plan import Plan
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memfit_trainer.optim import optimizer_in_backward, replicated_optimizer
from memfit_trainer.problems import Batch, TrainingProblem
from memfit_trainer.strategies.base import (
    move_batch,
    optimizer_state_facts,
    parameter_facts,
    scaled_backward,
    technique_facts,
)
from memfit_trainer.strategies.dcp import DcpRunnerSteps

AUTOCAST_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


class DdpRunner(DcpRunnerSteps):
    """DistributedDataParallel with no_sync() on all but the last micro-batch of a step."""

    engine = "ddp"
    checkpoint_format = "dcp"

    def __init__(self, *, plan: Plan, problem: TrainingProblem, device: torch.device, world_size: int = 1,
                 seed: int = 0) -> None:
        assert plan.training is not None
        if plan.optimizer_in_backward:
            _check_in_backward(plan, world_size)
        self.plan = plan
        self.problem = problem
        self.device = device
        model = problem.model.to(device)
        pure = plan.precision == Precision.BF16_PURE
        if pure:
            model.to(torch.bfloat16)  # before DDP: its buckets and all-reduce are bf16 too
        self.module = model
        self.model: torch.nn.Module = (
            DistributedDataParallel(
                model,
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True,
                find_unused_parameters=plan.find_unused_parameters,
            )
            if world_size > 1
            else model
        )
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer: Any = (
            optimizer_in_backward(model, plan, seed=seed)
            if plan.optimizer_in_backward
            else replicated_optimizer(params, plan, seed=seed)
        )
        self.autocast_dtype = AUTOCAST_DTYPES.get(plan.precision)  # none for fp32 and bf16-pure
        self.input_dtype = torch.bfloat16 if pure else None  # floating inputs (images) in the weights' dtype
        self.scaler = torch.amp.GradScaler(device.type) if plan.precision == Precision.FP16 else None
        self.accumulation = plan.gradient_accumulation_steps

    def micro_step(self, batch: Batch, *, last: bool) -> torch.Tensor:
        inputs = move_batch(batch, self.device, self.input_dtype)
        wrapped = isinstance(self.model, DistributedDataParallel)
        sync = self.model.no_sync() if wrapped and not last else contextlib.nullcontext()
        with sync:
            autocast = (
                torch.autocast(self.device.type, dtype=self.autocast_dtype)
                if self.autocast_dtype is not None
                else contextlib.nullcontext()
            )
            with autocast:
                loss = self.problem.loss_fn(self.model, inputs)
            scaled_backward(loss, accumulation=self.accumulation, scaler=self.scaler)
        return loss.detach()

    def checkpointed(self) -> nn.Module:
        return self.module

    def facts(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "ddp_wrapped": isinstance(self.model, DistributedDataParallel),
            "autocast_dtype": str(self.autocast_dtype) if self.autocast_dtype else None,
            "grad_scaler": self.scaler is not None,
            **parameter_facts(self.module),
            **optimizer_state_facts(self.optimizer),
            **technique_facts(self.module, self.optimizer),
        }


def _check_in_backward(plan: Plan, world_size: int) -> None:
    """The optimizer can step in backward only where a hook's gradient is final and unscaled."""
    if world_size != 1 or plan.gradient_accumulation_steps != 1 or plan.precision == Precision.FP16:
        raise ValueError(
            "strategy.optimizerInBackward needs DDP on one rank, gradientAccumulationSteps 1 and no fp16 "
            f"(got world size {world_size}, accumulation {plan.gradient_accumulation_steps}, "
            f"{plan.precision.value})"
        )

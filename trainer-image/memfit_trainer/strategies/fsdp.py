"""FSDP2: `fully_shard` per block and on the root, mixed precision and CPU offload from the Plan.

Stage 3 reshards parameters after forward (ZeRO-3-like); stage 2 keeps them unsharded between forward
and backward (`reshard_after_forward=False`, ZeRO-2-like). Gradients and optimizer state are always
sharded.

bf16-pure: the model is cast to bf16 before `fully_shard`, with a plain MixedPrecisionPolicy(), so the
sharded parameters, the gathered ones, the gradients and their reduce-scatter are all bf16; the optimizer
keeps bf16 state and rounds its updates stochastically (memfit_trainer.stochastic_rounding), or with
optimizer8bit keeps bitsandbytes' 8-bit state and updates the bf16 shards in place.
"""

from __future__ import annotations

from typing import Any

import torch
from memfit.api.common import Offload, Precision
from memfit.api.plan import Plan
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from memfit_trainer.optim import LocalShardOptimizer, bf16_pure_optimizer, torch_optimizer
from memfit_trainer.problems import Batch, TrainingProblem
from memfit_trainer.strategies.base import (
    move_batch,
    optimizer_state_facts,
    parameter_facts,
    scaled_backward,
    technique_facts,
)
from memfit_trainer.strategies.dcp import DcpRunnerSteps

PARAM_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def mixed_precision_policy(precision: Precision) -> MixedPrecisionPolicy:
    """Compute in bf16/fp16, keep fp32 shards, reduce gradients in fp32; fp32 and bf16-pure: the parameters'
    own dtype throughout (no cast)."""
    dtype = PARAM_DTYPES.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def offload_policy(offload: Offload, device: torch.device) -> OffloadPolicy:
    """CPUOffloadPolicy for offload cpu (pinned host memory only when a GPU exists)."""
    if offload == Offload.CPU:
        return CPUOffloadPolicy(pin_memory=device.type == "cuda")
    return OffloadPolicy()


class FsdpRunner(DcpRunnerSteps):
    """FSDP2 over all ranks (1-D mesh), gradient sync only on the last micro-batch of a step."""

    engine = "fsdp"
    checkpoint_format = "dcp"

    def __init__(
        self, *, plan: Plan, problem: TrainingProblem, device: torch.device, world_size: int, seed: int = 0
    ) -> None:
        assert plan.training is not None
        pure = plan.precision == Precision.BF16_PURE
        if plan.optimizer_in_backward or (pure and plan.offload != Offload.NONE):
            raise ValueError("FSDP runs neither strategy.optimizerInBackward nor bf16-pure with offload "
                             "(the planner never plans them)")
        if pure:
            problem.model.to(torch.bfloat16)
        self.plan = plan
        self.problem = problem
        self.device = device
        mesh = init_device_mesh(device.type, (world_size,))
        settings: dict[str, Any] = {
            "mesh": mesh,
            "reshard_after_forward": plan.zero_stage == 3,
            "mp_policy": mixed_precision_policy(plan.precision),
            "offload_policy": offload_policy(plan.offload, device),
        }
        for block in problem.blocks:
            fully_shard(block, **settings)
        self.model = fully_shard(problem.model, **settings)
        self.loaded_from_rank0 = problem.after_shard is not None
        if problem.after_shard is not None:
            offloaded = plan.offload == Offload.CPU
            problem.after_shard(self.model, torch.device("cpu") if offloaded else device)
        self.settings = settings
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: Any = (
            LocalShardOptimizer(params, plan.training)
            if plan.optimizer8bit
            else bf16_pure_optimizer(params, plan.training, seed=seed)
            if pure
            else torch_optimizer(params, plan.training, plan.optimizer_implementation)
        )
        self.scaler = self._fp16_scaler() if plan.precision == Precision.FP16 else None
        # bf16-pure: floating inputs (images) in the weights' dtype (a plain MixedPrecisionPolicy casts none).
        self.input_dtype = torch.bfloat16 if pure else None
        self.accumulation = plan.gradient_accumulation_steps

    def _fp16_scaler(self) -> Any:
        # Sharded gradients: the scaler must agree across ranks on skipping a step (all-reduced inf check).
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=self.device.type)

    def micro_step(self, batch: Batch, *, last: bool) -> torch.Tensor:
        self.model.set_requires_gradient_sync(last)
        inputs = move_batch(batch, self.device, self.input_dtype)
        loss = self.problem.loss_fn(self.model, inputs)
        scaled_backward(loss, accumulation=self.accumulation, scaler=self.scaler)
        return loss.detach()

    def checkpointed(self) -> nn.Module:
        return self.model

    def facts(self) -> dict[str, Any]:
        mp = self.settings["mp_policy"]
        return {
            "engine": self.engine,
            "reshard_after_forward": self.settings["reshard_after_forward"],
            "mp_param_dtype": str(mp.param_dtype) if mp.param_dtype else None,
            "mp_reduce_dtype": str(mp.reduce_dtype) if mp.reduce_dtype else None,
            "offload_policy": type(self.settings["offload_policy"]).__name__,
            "pretrained_from_rank0": self.loaded_from_rank0,
            "grad_scaler": self.scaler is not None,
            "fsdp_units": 1 + len(self.problem.blocks),
            **parameter_facts(self.model),
            **optimizer_state_facts(self.optimizer),
            **technique_facts(self.model, self.optimizer),
        }

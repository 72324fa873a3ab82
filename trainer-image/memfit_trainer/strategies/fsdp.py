"""FSDP2: `fully_shard` per block and on the root, mixed precision and CPU offload from the Plan.

Stage 3 reshards parameters after forward (ZeRO-3-like); stage 2 keeps them unsharded between forward
and backward (`reshard_after_forward=False`, ZeRO-2-like). Gradients and optimizer state are always
sharded.
"""

from __future__ import annotations

from typing import Any

import torch
from memfit.api.common import Offload, Precision
from memfit.api.plan import Plan
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from memfit_trainer.optim import LocalShardOptimizer, torch_optimizer
from memfit_trainer.problems import Batch, TrainingProblem
from memfit_trainer.strategies.base import (
    move_batch,
    optimizer_state_facts,
    parameter_facts,
    scaled_backward,
)
from memfit_trainer.strategies.dcp import DcpRunnerSteps

PARAM_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def mixed_precision_policy(precision: Precision) -> MixedPrecisionPolicy:
    """Compute in bf16/fp16, keep fp32 shards, reduce gradients in fp32."""
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
        self, *, plan: Plan, problem: TrainingProblem, device: torch.device, world_size: int
    ) -> None:
        assert plan.training is not None
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
            else torch_optimizer(params, plan.training)
        )
        self.scaler = self._fp16_scaler() if plan.precision == Precision.FP16 else None
        self.accumulation = plan.gradient_accumulation_steps

    def _fp16_scaler(self) -> Any:
        # Sharded gradients: the scaler must agree across ranks on skipping a step (all-reduced inf check).
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=self.device.type)

    def micro_step(self, batch: Batch, *, last: bool) -> torch.Tensor:
        self.model.set_requires_gradient_sync(last)
        inputs = move_batch(batch, self.device)
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
        }

"""DeepSpeed: ZeRO 0-3, CPU/NVMe offload, bf16/fp16 with loss scaling, from build_deepspeed_config(plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from memfit.api.common import Precision
from memfit.api.plan import Plan

from memfit_trainer.optim import bnb_optimizer
from memfit_trainer.problems import Batch, TrainingProblem
from memfit_trainer.strategies.base import move_batch, optimizer_state_facts, parameter_facts, technique_facts
from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config

ENGINE_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
# DeepSpeed <= 0.19.8: with fp16 and ZeRO-0, engine.backward() does not scale the loss but the FP16
# optimizer's step() still divides gradients by the loss scale, so updates are ~2**16 times too small
# (deepspeedai/DeepSpeed PR #8393, open). The runner scales the loss itself on those versions.
ZERO0_FP16_UNSCALED_UP_TO = (0, 19, 8)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def zero0_fp16_needs_loss_scaling(version: str, *, zero_stage: int, fp16: bool) -> bool:
    """True on DeepSpeed versions whose engine leaves the fp16 ZeRO-0 loss unscaled."""
    return fp16 and zero_stage == 0 and _version_tuple(version) <= ZERO0_FP16_UNSCALED_UP_TO


class DeepSpeedRunner:
    """A DeepSpeed engine; it accumulates gradients itself and steps at the accumulation boundary."""

    engine = "deepspeed"
    checkpoint_format = "deepspeed"

    def __init__(self, *, plan: Plan, problem: TrainingProblem, device: torch.device) -> None:
        import deepspeed

        assert plan.training is not None
        if plan.precision == Precision.BF16_PURE or plan.optimizer_in_backward:
            raise ValueError("DeepSpeed runs neither bf16-pure nor strategy.optimizerInBackward (it keeps its own "
                             "fp32 master weights and steps after backward); the planner never plans them")
        self.plan = plan
        self.problem = problem
        self.device = device
        self.config = build_deepspeed_config(plan, cuda=device.type == "cuda")
        params = [p for p in problem.model.parameters() if p.requires_grad]
        client = bnb_optimizer(params, plan.training) if plan.optimizer8bit else None
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=problem.model,
            optimizer=client,
            model_parameters=params if client is None else None,
            config=self.config,
            dist_init_required=False,
        )
        self.input_dtype = ENGINE_DTYPES.get(plan.precision)
        self.scale_loss = zero0_fp16_needs_loss_scaling(
            deepspeed.__version__, zero_stage=plan.zero_stage, fp16=plan.precision == Precision.FP16
        )

    def micro_step(self, batch: Batch, *, last: bool) -> torch.Tensor:
        inputs = move_batch(batch, self.device, self.input_dtype)
        loss = self.problem.loss_fn(self.model, inputs)
        self.model.backward(loss.float() * self.optimizer.loss_scale if self.scale_loss else loss)
        self.model.step()  # a no-op for the optimizer until the accumulation boundary
        return loss.detach()

    def optimizer_step(self) -> None:
        return None

    def save(self, directory: Path, tag: str) -> None:
        self.model.save_checkpoint(str(directory), tag=tag, save_latest=False)

    def load(self, directory: Path, tag: str) -> None:
        path, _ = self.model.load_checkpoint(
            str(directory), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag} in {directory}")

    def basic_optimizer(self) -> Any:
        """The optimizer that owns the state (inside DeepSpeed's ZeRO or mixed-precision wrapper)."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def facts(self) -> dict[str, Any]:
        zero = self.config["zero_optimization"]
        return {
            "engine": self.engine,
            "zero_stage": int(self.model.zero_optimization_stage()),
            "wrapper_class": type(self.optimizer).__name__,
            "offload_optimizer": zero.get("offload_optimizer", {}).get("device"),
            "offload_param": zero.get("offload_param", {}).get("device"),
            "bf16": bool(self.model.bfloat16_enabled()),
            "fp16": bool(self.model.fp16_enabled()),
            "loss_scale": float(getattr(self.optimizer, "loss_scale", 0.0) or 0.0)
            if self.model.fp16_enabled()
            else None,
            "gradient_accumulation_steps": int(self.model.gradient_accumulation_steps()),
            "train_micro_batch_size_per_gpu": int(self.model.train_micro_batch_size_per_gpu()),
            **parameter_facts(self.model.module),
            **optimizer_state_facts(self.basic_optimizer()),
            **technique_facts(self.model.module, self.optimizer),
        }

    def close(self) -> None:
        self.model.destroy()

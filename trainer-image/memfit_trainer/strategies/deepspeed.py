"""DeepSpeed: ZeRO 0-3, CPU/NVMe offload, bf16/fp16 with loss scaling, from build_deepspeed_config(plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from memfit.api.common import Precision
from memfit.api.plan import Plan

from memfit_trainer.optim import bnb_optimizer
from memfit_trainer.problems import Batch, TrainingProblem
from memfit_trainer.strategies.base import move_batch, optimizer_state_facts, parameter_facts
from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config

ENGINE_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


class DeepSpeedRunner:
    """A DeepSpeed engine; it accumulates gradients itself and steps at the accumulation boundary."""

    engine = "deepspeed"
    checkpoint_format = "deepspeed"

    def __init__(self, *, plan: Plan, problem: TrainingProblem, device: torch.device) -> None:
        import deepspeed

        assert plan.training is not None
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

    def micro_step(self, batch: Batch, *, last: bool) -> torch.Tensor:
        inputs = move_batch(batch, self.device, self.input_dtype)
        loss = self.problem.loss_fn(self.model, inputs)
        self.model.backward(loss)
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
            "gradient_accumulation_steps": int(self.model.gradient_accumulation_steps()),
            "train_micro_batch_size_per_gpu": int(self.model.train_micro_batch_size_per_gpu()),
            **parameter_facts(self.model.module),
            **optimizer_state_facts(self.basic_optimizer()),
        }

    def close(self) -> None:
        self.model.destroy()

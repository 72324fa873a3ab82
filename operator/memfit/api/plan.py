"""Plan: the configuration the planner chose (operator -> trainer contract, mounted as a ConfigMap)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memfit.api.common import ApiModel, Checkpointing, Engine, Offload, Precision
from memfit.api.job import TrainingSpec
from memfit.api.problem import Problem

PLAN_SCHEMA = "memfit.dev/plan/v1"


class MemoryBreakdown(ApiModel):
    """Predicted per-GPU peak, by component, in bytes."""

    parameters_bytes: int = Field(ge=0)
    gradients_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)
    activations_bytes: int = Field(ge=0)
    temporaries_bytes: int = Field(ge=0)
    overhead_bytes: int = Field(ge=0)
    peak_bytes: int = Field(ge=0)
    host_bytes: int = Field(default=0, ge=0, description="Host RAM per GPU for offload.")
    nvme_bytes: int = Field(default=0, ge=0, description="NVMe per GPU for offload.")


class Plan(ApiModel):
    """Everything a training pod needs to apply the chosen configuration."""

    schema_version: Literal["memfit.dev/plan/v1"] = "memfit.dev/plan/v1"
    engine: Engine
    zero_stage: int = Field(ge=0, le=3)
    precision: Precision
    activation_checkpointing: Checkpointing
    offload: Offload
    optimizer8bit: bool
    micro_batch_size: int = Field(ge=1)
    gradient_accumulation_steps: int = Field(ge=1)
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    node_pool: str
    gpu_product: str
    gpu_memory_bytes: int = Field(ge=0)
    memory: MemoryBreakdown
    headroom_percent: int = Field(ge=0)
    price_per_hour: float = Field(ge=0)
    step_seconds: float = Field(ge=0)
    estimated_hours: float = Field(ge=0)
    estimated_cost: float = Field(ge=0)
    problem: Problem | None = None
    training: TrainingSpec | None = None
    memory_sources: dict[str, Literal["measured", "analytic"]] | None = Field(
        default=None, max_length=8,
        description="Per memory term (parameters, optimizer, activations, step, fragmentation): from the "
        "profile's measurements or from the analytic model.",
    )
    find_unused_parameters: bool = Field(
        default=False,
        description="DDP find_unused_parameters: the profile saw trainable parameters without a gradient.",
    )
    attempt: int = Field(default=0, ge=0)
    checkpoint_dir: str | None = Field(default=None, max_length=1024)
    nvme_path: str | None = Field(default=None, max_length=1024)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        """One line: `4xL4 bf16 ZeRO-2 ckpt 8-bit Adam mbs 2x4`."""
        parts = [f"{self.world_size}x{self.gpu_product}", self.precision.value]
        if self.engine == Engine.DEEPSPEED:
            parts.append(f"ZeRO-{self.zero_stage}")
        elif self.engine == Engine.FSDP:
            parts.append("FSDP-full-shard" if self.zero_stage == 3 else "FSDP-grad-op")
        else:
            parts.append("DDP")
        if self.activation_checkpointing != Checkpointing.NONE:
            parts.append(f"ckpt-{self.activation_checkpointing.value}")
        if self.offload != Offload.NONE:
            parts.append(f"offload-{self.offload.value}")
        if self.optimizer8bit:
            parts.append("8-bit-optim")
        parts.append(f"mbs {self.micro_batch_size}x{self.gradient_accumulation_steps}")
        return " ".join(parts)

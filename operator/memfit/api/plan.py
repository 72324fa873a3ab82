"""Plan: the configuration the planner chose (operator -> trainer contract, mounted as a ConfigMap)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from memfit.api.common import ApiModel
from memfit.api.data import DataSpec
from memfit.api.job import DEFAULT_CHECKPOINT_EVERY_STEPS, PlanSummary, TrainingSpec
from memfit.api.peft import AdapterSettings
from memfit.api.problem import Problem
from memfit.api.training_config import TrainingConfig

PLAN_SCHEMA = "memfit.dev/plan/v1"


def savings_text(percent: float) -> str:
    """Savings that read as savings: `saves 42%`, `costs 12% more`, `same cost`."""
    if round(percent) > 0:
        return f"saves {percent:.0f}%"
    if round(percent) < 0:
        return f"costs {-percent:.0f}% more"
    return "same cost"


def round_cost(value: float) -> float:
    """Six decimals, or six significant digits below 0.001: a tiny job's $0.00000005 stays non-zero
    (fixed decimals alone rounded it to 0 and the status read `Estimated Cost: 0`)."""
    return round(value, 6) if abs(value) >= 1e-3 else float(f"{value:.6g}")


class BaselineCost(ApiModel):
    """A baseline as the plan records it, so a status rebuilt from the Plan keeps it."""

    label: str = Field(max_length=256)
    cost_per_hour: float = Field(ge=0)
    cost: float = Field(ge=0)
    savings_percent: float
    hours: float | None = Field(default=None, ge=0, description="Its predicted hours (the wall-clock beside the cost).")


class MemoryBreakdown(ApiModel):
    """Predicted per-GPU peak, by component, in bytes."""

    parameters_bytes: int = Field(ge=0)
    gradients_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)
    activations_bytes: int = Field(ge=0)
    temporaries_bytes: int = Field(ge=0)
    overhead_bytes: int = Field(ge=0)
    peak_bytes: int = Field(ge=0, description="Device memory used at the peak: what nvidia-smi shows (reserved "
                            "plus the CUDA context, cuBLAS workspace and NCCL buffers).")
    allocated_bytes: int | None = Field(
        default=None, ge=0, description="The tensors alone: what torch.cuda.max_memory_allocated reports.")
    reserved_bytes: int | None = Field(
        default=None, ge=0, description="Allocated plus the caching allocator's rounding and fragmentation: what "
        "torch.cuda.max_memory_reserved reports.")
    host_bytes: int = Field(default=0, ge=0, description="Host RAM per GPU for offload (states and activations).")
    host_activation_bytes: int = Field(
        default=0, ge=0, description="The part of hostBytes that is offloaded activations (activation offload).")
    nvme_bytes: int = Field(default=0, ge=0, description="NVMe per GPU for offload.")


class FullFinetuneComparison(ApiModel):
    """A LoRA/QLoRA plan next to the best full fine-tune the planner found (or why there is none)."""

    peak_bytes: int | None = Field(default=None, ge=0, description="Predicted per-GPU peak of the full fine-tune.")
    estimated_cost: float | None = Field(default=None, ge=0, description="Its total cost.")
    description: str = Field(default="", max_length=256, description="Its GPUs and configuration, or why none fits.")


class Plan(TrainingConfig):
    """Everything a training pod needs to apply the chosen configuration: the TrainingConfig (inline,
    its fields flat in the JSON) on a pool, with the predictions it was chosen on."""

    schema_version: Literal["memfit.dev/plan/v1"] = "memfit.dev/plan/v1"
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    node_pool: str
    gpu_product: str
    gpu_memory_bytes: int = Field(ge=0)
    memory: MemoryBreakdown
    headroom_percent: int = Field(ge=0)
    price_per_hour: float = Field(ge=0)
    step_seconds: float = Field(ge=0)
    model_step_seconds: float | None = Field(
        default=None, ge=0, description="The step time before any factor learned from measured step times, "
        "and its compute part: what the run's measured step time teaches against (like for like).")
    model_compute_seconds: float | None = Field(default=None, ge=0)
    estimated_hours: float = Field(ge=0)
    estimated_cost: float = Field(ge=0)
    problem: Problem | None = None
    training: TrainingSpec | None = None
    data: DataSpec | None = Field(
        default=None, description="The job's spec.data: what the trainer tokenizes and packs (absent: synthetic).")
    memory_sources: dict[str, Literal["measured", "analytic"]] | None = Field(
        default=None, max_length=8,
        description="Per memory term (parameters, optimizer, activations, step, fragmentation): from the "
        "profile's measurements or from the analytic model.",
    )
    find_unused_parameters: bool = Field(
        default=False,
        description="DDP find_unused_parameters: the profile saw trainable parameters without a gradient.",
    )
    baseline: BaselineCost | None = Field(
        default=None, description="The default baseline (the practitioner's setup without a planner) and savings.")
    declared_baseline: BaselineCost | None = Field(default=None, description="placement.baseline, beside it.")
    adapter: AdapterSettings | None = Field(
        default=None, description="LoRA/QLoRA: rank, alpha, dropout, target modules, 4-bit settings.")
    parameters: int | None = Field(default=None, ge=0, description="Parameters of the model (base, no adapters).")
    trainable_parameters: int | None = Field(default=None, ge=0, description="Parameters the optimizer trains.")
    full_finetune: FullFinetuneComparison | None = Field(
        default=None, description="For a LoRA/QLoRA plan: the full fine-tune it was compared with.")
    cost_notes: list[str] = Field(
        default_factory=list, max_length=8,
        description="Why it costs what it does: the part of a node it uses, spot interruptions priced as risk.")
    checkpoint_every_steps: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="Steps between checkpoints: the job's training.checkpoint.everySteps, or the interval "
        "memfit chose for this plan when the job leaves it unset (see costNotes).",
    )
    attempt: int = Field(default=0, ge=0)
    checkpoint_dir: str | None = Field(default=None, max_length=1024)
    nvme_path: str | None = Field(default=None, max_length=1024)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def checkpoint_interval_steps(self) -> int:
        """The steps between the trainer's checkpoints: the job's pinned `everySteps` wins, then the plan's
        choice, then the old fixed default (a plan written before memfit chose intervals)."""
        pinned = self.training.checkpoint.every_steps if self.training is not None else None
        return pinned or self.checkpoint_every_steps or DEFAULT_CHECKPOINT_EVERY_STEPS

    @property
    def trainable_fraction(self) -> float | None:
        """Trainable / all parameters (LoRA: the adapters' share), when both are known."""
        if not self.parameters or self.trainable_parameters is None:
            return None
        return self.trainable_parameters / self.parameters

    def describe(self, *, words: bool = False, batch: bool = True) -> str:
        """The GPUs, then the configuration: `4xL4 ZeRO-2 bf16 ckpt-full 8-bit-optim mbs 2x4`."""
        return f"{self.world_size}x{self.gpu_product} {super().describe(words=words, batch=batch)}"

    def summary(self) -> PlanSummary:
        """The status summary (`kubectl get motj` columns), rebuilt from the Plan alone: the baselines
        and savings travel in it, so a status rebuilt after a restart is the same."""
        gib = 1024**3
        base, declared = self.baseline, self.declared_baseline
        return PlanSummary(
            **self.training_config().model_dump(),
            node_pool=self.node_pool,
            nodes=self.nodes,
            gpus=self.world_size,
            gpu_product=self.gpu_product[:128],
            predicted_peak_bytes=self.memory.peak_bytes,
            predicted_peak=f"{self.memory.peak_bytes / gib:.1f}Gi",
            gpu_memory_bytes=self.gpu_memory_bytes,
            cost_per_hour=round_cost(self.price_per_hour),
            cost_per_hour_text=f"${self.price_per_hour:.2f}",
            estimated_hours=round_cost(self.estimated_hours),
            estimated_cost=round_cost(self.estimated_cost),
            baseline=base.label if base else None,
            baseline_cost_per_hour=round_cost(base.cost_per_hour) if base else None,
            baseline_cost=round_cost(base.cost) if base else None,
            savings_percent=round(base.savings_percent, 1) if base else None,
            savings=savings_text(base.savings_percent) if base else None,
            wall_clock_ratio=(round(self.estimated_hours / base.hours, 3)
                              if base and base.hours and math.isfinite(base.hours) else None),
            declared_baseline=declared.label if declared else None,
            declared_baseline_cost=round_cost(declared.cost) if declared else None,
            declared_savings_percent=round(declared.savings_percent, 1) if declared else None,
            cost_note="; ".join(self.cost_notes)[:1024] or None,
        )

"""Fluent factories for builder tests: plans, owners, placements."""

from __future__ import annotations

from typing import Any

from memfit.api.common import Checkpointing, Engine, Offload, Precision, Toleration
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.plan import MemoryBreakdown, Plan
from memfit.kube.common import Owner, Placement, PodSettings

OWNER = Owner(name="llama", namespace="ml", uid="1234-uid")
PLACEMENT = Placement(
    pool="l4x4",
    node_selector={"node.kubernetes.io/instance-type": "g6.12xlarge"},
    tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
)
POD = PodSettings(image="memfit-trainer:1", extra_labels={"team": "ml"})


def make_plan(**overrides: Any) -> Plan:
    values: dict[str, Any] = {
        "engine": Engine.DEEPSPEED,
        "zero_stage": 2,
        "precision": Precision.BF16,
        "activation_checkpointing": Checkpointing.FULL,
        "offload": Offload.NONE,
        "optimizer8bit": True,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "nodes": 2,
        "gpus_per_node": 4,
        "node_pool": "l4x4",
        "gpu_product": "NVIDIA-L4",
        "gpu_memory_bytes": 23034 * 2**20,
        "memory": MemoryBreakdown(
            parameters_bytes=1,
            gradients_bytes=1,
            optimizer_bytes=1,
            activations_bytes=1,
            temporaries_bytes=1,
            overhead_bytes=1,
            peak_bytes=6,
            host_bytes=0,
            nvme_bytes=0,
        ),
        "headroom_percent": 10,
        "price_per_hour": 9.2,
        "step_seconds": 1.0,
        "estimated_hours": 2.0,
        "estimated_cost": 18.4,
        "attempt": 1,
    }
    values.update(overrides)
    return Plan(**values)


def make_spec(**sections: Any) -> MemoryOptimizedTrainingJobSpec:
    raw: dict[str, Any] = {"problem": {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}}}
    raw.update(sections)
    return MemoryOptimizedTrainingJobSpec.model_validate(raw)

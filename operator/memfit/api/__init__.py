"""memfit API: the CRD models (MOTJ, GPUNodePool) and the Profile, Plan and TrainingConfig contracts."""

from __future__ import annotations

from memfit.api.common import API_GROUP, API_VERSION, Checkpointing, Engine, Offload, Precision, Toggle
from memfit.api.job import (
    MemoryOptimizedTrainingJob,
    MemoryOptimizedTrainingJobSpec,
    MemoryOptimizedTrainingJobStatus,
)
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool, GPUNodePoolSpec, GPUNodePoolStatus
from memfit.api.profile import Profile
from memfit.api.training_config import TrainingConfig

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "Checkpointing",
    "Engine",
    "GPUNodePool",
    "GPUNodePoolSpec",
    "GPUNodePoolStatus",
    "MemoryOptimizedTrainingJob",
    "MemoryOptimizedTrainingJobSpec",
    "MemoryOptimizedTrainingJobStatus",
    "Offload",
    "Plan",
    "Precision",
    "Profile",
    "Toggle",
    "TrainingConfig",
]

"""What to train: builtin gpt/bert/vit, Hugging Face `from_config`, or a user entrypoint.

Shared by the trainer and the profiler. `build_problem(spec, seed=…)` seeds torch first, so every
rank builds identical initial weights.
"""

from __future__ import annotations

import torch
from memfit.api.problem import Problem as ProblemSpec

from memfit_trainer.problems.base import Batch, BatchKey, TrainingProblem, default_attention_of
from memfit_trainer.problems.builtin import build_builtin
from memfit_trainer.problems.entrypoint import load_entrypoint
from memfit_trainer.problems.errors import DepthNotSupported, ProblemError
from memfit_trainer.problems.huggingface import Finetune, build_huggingface

Problem = TrainingProblem
"""Alias for entrypoint authors (`memfit_trainer.problems.Problem`)."""

__all__ = [
    "Batch",
    "BatchKey",
    "DepthNotSupported",
    "Finetune",
    "Problem",
    "ProblemError",
    "TrainingProblem",
    "build_problem",
    "default_attention_of",
]


def build_problem(spec: ProblemSpec, *, seed: int = 0, depth: int | None = None,
                  check: bool = True, finetune: Finetune | None = None) -> TrainingProblem:
    """Build the model and data source of a job's problem with deterministic initial weights.

    `depth` builds the same architecture with only that many repeated blocks (depth-reduced
    profiles): builtin problems get `layers = depth`, Hugging Face configs `num_hidden_layers =
    depth`, entrypoints are called with `depth=` (ProblemError when the function takes no `depth`).
    `check=False` skips the entrypoint's batch check (a build on the meta device draws no data).
    `finetune` (the trainer only): pretrained weights and `spec.data` for a Hugging Face problem.
    """
    torch.manual_seed(seed)
    if spec.builtin is not None:
        builtin = spec.builtin if depth is None else spec.builtin.model_copy(update={"layers": depth})
        return build_builtin(builtin)
    if spec.huggingface is not None:
        return build_huggingface(spec.huggingface, depth=depth, finetune=finetune)
    if spec.entrypoint is not None:
        return load_entrypoint(spec.entrypoint, depth=depth, check=check)
    raise ProblemError("problem: exactly one of builtin, huggingface or entrypoint must be set")

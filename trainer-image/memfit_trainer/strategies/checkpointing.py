"""Activation checkpointing with torch.utils.checkpoint (non-reentrant), for every engine.

`full` recomputes each block; `selective` recomputes only each block's attention (Korthikanti et al.
2023 recompute the attention core; here the whole attention sub-module). The module's `forward` is
replaced in place, so parameter names (and checkpoints) do not change with the mode, and the engine's
hooks on the module (FSDP2 all-gather, ZeRO-3 gather) still run around it. DeepSpeed's own reentrant
`deepspeed.checkpointing` is not used: with ZeRO-3 it recomputes against released parameters
(seen with DeepSpeed 0.19 on CPU: "Given normalized_shape=[64] ... got input of size[]").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from memfit.api.common import Checkpointing
from torch import nn

from memfit_trainer.problems import TrainingProblem

log = logging.getLogger(__name__)
MARK = "_memfit_checkpointed"


def checkpoint_module(module: nn.Module) -> None:
    """Recompute this module's forward in backward instead of keeping its activations."""
    if getattr(module, MARK, False):
        return
    forward: Callable[..., Any] = module.forward

    @functools.wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed  # type: ignore[method-assign]
    setattr(module, MARK, True)


def checkpoint_targets(problem: TrainingProblem, mode: Checkpointing) -> list[nn.Module]:
    """The modules to recompute: every block (full) or every block's attention (selective)."""
    if mode == Checkpointing.FULL:
        return list(problem.blocks)
    if mode == Checkpointing.SELECTIVE:
        targets = [problem.attention_of(block) for block in problem.blocks]
        found = [t for t in targets if t is not None]
        if len(found) < len(targets):
            log.warning(
                "selective checkpointing: %d of %d blocks have no attention sub-module; recomputing those blocks",
                len(targets) - len(found),
                len(targets),
            )
            return [t if t is not None else b for t, b in zip(targets, problem.blocks, strict=True)]
        return found
    return []


def apply_activation_checkpointing(problem: TrainingProblem, mode: Checkpointing) -> int:
    """Apply the plan's checkpointing to the problem's model; the number of modules recomputed."""
    targets = checkpoint_targets(problem, mode)
    for module in targets:
        checkpoint_module(module)
    return len(targets)


def checkpointed_modules(model: nn.Module) -> int:
    """How many modules of a model recompute their forward."""
    return sum(1 for m in model.modules() if getattr(m, MARK, False))

"""Activation checkpointing with torch.utils.checkpoint (non-reentrant), for every engine.

`full` recomputes each block; `selective` recomputes only each block's attention (Korthikanti et al.
2023 recompute the attention core; here the whole attention sub-module); `selective-op` recomputes each
block under torch's selective activation checkpointing (`create_selective_checkpoint_contexts`, torch >=
2.4): the outputs of the matmuls and of the SDPA kernels are saved, every other op (norms, activations,
rotary embeddings, residual adds) re-runs in backward -- the per-op policy of torchtitan's `op` mode. The module's `forward` is
replaced in place, so parameter names (and checkpoints) do not change with the mode, and the engine's
hooks on the module (FSDP2 all-gather, ZeRO-3 gather) still run around it. DeepSpeed's own reentrant
`deepspeed.checkpointing` is not used: with ZeRO-3 it recomputes against released parameters
(seen with DeepSpeed 0.19 on CPU: "Given normalized_shape=[64] ... got input of size[]").
"""

from __future__ import annotations

import functools
import inspect
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


def _saved_ops() -> frozenset[Any]:
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return frozenset(getattr(aten, name).default for name in names if hasattr(aten, name))


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """selective-op's policy: save what the matmuls and attention kernels return, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


SAVED_OPS = _saved_ops()
_SAC_HOOKS_KNOB = "respect_saved_tensors_hooks" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters


def _selective_op_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_keep_matmuls)


def checkpoint_module(module: nn.Module, *, keep_matmuls: bool = False) -> None:
    """Recompute this module's forward in backward instead of keeping its activations (`keep_matmuls`: but
    keep the outputs of its matmuls and attention kernels, selective-op)."""
    if getattr(module, MARK, False):
        return
    forward: Callable[..., Any] = module.forward
    extra: dict[str, Any] = {"context_fn": _selective_op_context} if keep_matmuls else {}
    if keep_matmuls and _SAC_HOOKS_KNOB:
        # What selective-op keeps stays in its own cache, never in saved-tensor hooks around it (activation
        # offload's): torch 2.15 does so by default and warns that a later release will not.
        extra["respect_saved_tensors_hooks"] = False

    @functools.wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    module.forward = checkpointed  # type: ignore[method-assign]
    setattr(module, MARK, True)


def checkpoint_targets(problem: TrainingProblem, mode: Checkpointing) -> list[nn.Module]:
    """The modules to recompute: every block (full, selective-op) or every block's attention (selective)."""
    if mode in (Checkpointing.FULL, Checkpointing.SELECTIVE_OP):
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
        checkpoint_module(module, keep_matmuls=mode == Checkpointing.SELECTIVE_OP)
    return len(targets)


def checkpointed_modules(model: nn.Module) -> int:
    """How many modules of a model recompute their forward."""
    return sum(1 for m in model.modules() if getattr(m, MARK, False))

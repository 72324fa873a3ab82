"""One single-process training step under a profile configuration (precision, checkpointing, optimizer).

Mixed precision is autocast over fp32 weights (the DDP regime: 16 bytes/param of model states);
fp16 adds a GradScaler. Checkpointing `full` recomputes each block, `selective` each block's attention
(`TrainingProblem.attention_of`), with non-reentrant `torch.utils.checkpoint`. The 8-bit optimizers
are bitsandbytes' blockwise ones (Dettmers et al. 2022, arXiv 2110.02861).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from memfit.api.common import Checkpointing, Precision
from memfit.api.job import OptimizerKind
from torch import nn
from torch.utils.checkpoint import checkpoint

from memfit_trainer.problems import BatchKey, TrainingProblem

LEARNING_RATE = 1e-4
# As the trainer's optimizers (memfit_trainer/optim.py): SGD keeps one momentum buffer (4 bytes/param).
SGD_MOMENTUM = 0.9
ADAMW_WEIGHT_DECAY = 0.01
AUTOCAST_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def make_optimizer(model: nn.Module, kind: OptimizerKind, *, eight_bit: bool) -> torch.optim.Optimizer:
    """The job's optimizer over the trainable parameters; bitsandbytes' 8-bit variant when asked."""
    params = [p for p in model.parameters() if p.requires_grad]
    if eight_bit:
        import bitsandbytes as bnb

        eight: dict[OptimizerKind, Any] = {
            OptimizerKind.ADAMW: functools.partial(
                bnb.optim.AdamW8bit, lr=LEARNING_RATE, weight_decay=ADAMW_WEIGHT_DECAY
            ),
            OptimizerKind.ADAM: functools.partial(bnb.optim.Adam8bit, lr=LEARNING_RATE),
            OptimizerKind.SGD: functools.partial(bnb.optim.SGD8bit, lr=LEARNING_RATE, momentum=SGD_MOMENTUM),
        }
        optimizer: torch.optim.Optimizer = eight[kind](params)
        return optimizer
    if kind == OptimizerKind.SGD:
        return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=SGD_MOMENTUM)
    if kind == OptimizerKind.ADAM:
        return torch.optim.Adam(params, lr=LEARNING_RATE)
    return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=ADAMW_WEIGHT_DECAY)


def materialise_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Allocate the (lazily created) optimizer state with one zero-gradient step, without a forward.

    Every later measured step then sees the steady state, as step 2+ of a real run does.
    """
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def activation_checkpointing(problem: TrainingProblem, mode: Checkpointing) -> Iterator[None]:
    """Recompute each block (`full`) or each block's attention (`selective`) in backward, reversibly.

    Same wrapping as the trainer's (non-reentrant `torch.utils.checkpoint` around the module's
    forward, skipped without grad), undone on exit so that one model serves every configuration.
    """
    if mode in (Checkpointing.NONE, Checkpointing.AUTO):
        yield
        return
    if mode == Checkpointing.FULL:
        targets = list(problem.blocks)
    else:  # selective: the attention, or the whole block when it has no attention sub-module
        targets = [problem.attention_of(b) or b for b in problem.blocks]
    patched = []
    for module in targets:
        if "forward" in module.__dict__:
            continue  # already wrapped (a module shared between blocks)
        module.forward = _checkpointed(module.forward)  # type: ignore[method-assign]
        patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast for bf16/fp16 compute over fp32 weights; nothing for fp32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def batch_for(problem: TrainingProblem, *, micro_batch_size: int, step: int, device: torch.device) -> Any:
    """The deterministic synthetic micro-batch of a step, on the device."""
    batch = problem.make_batch(BatchKey(seed=0, step=step, sample_start=0, samples=micro_batch_size))
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def train_step(
    problem: TrainingProblem,
    optimizer: torch.optim.Optimizer,
    *,
    precision: Precision,
    micro_batch_size: int,
    step: int,
    device: torch.device,
    scaler: torch.amp.GradScaler | None = None,
    model: nn.Module | None = None,
    phase: Callable[[str], AbstractContextManager[object]] | None = None,
) -> float:
    """Forward, backward, optimizer step and zero_grad(set_to_none) of one micro-batch; the loss.

    `model` is what the loss calls: the problem's model, or its DDP wrapper. `phase(name)`, when
    given, wraps forward+backward ("backward") and the optimizer step ("step"), e.g. meter regions.
    """
    mark = phase or (lambda _name: contextlib.nullcontext())
    batch = batch_for(problem, micro_batch_size=micro_batch_size, step=step, device=device)
    with mark("backward"):
        with autocast(precision, device):
            loss = problem.loss_fn(model if model is not None else problem.model, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
    with mark("step"):
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    value = float(loss.detach())
    del loss, batch
    return value

"""Optimizers: torch AdamW/Adam/SGD, bitsandbytes 8-bit state (with a shim for FSDP2's DTensor shards), or
bf16-pure's stochastically rounded bf16 optimizers; one per parameter when the step runs in backward."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from memfit.api.common import OptimizerImplementation, Precision
from memfit.api.job import OptimizerKind, TrainingSpec
from memfit.api.plan import Plan
from torch import nn

from memfit_trainer.optim_in_backward import OptimizerInBackward
from memfit_trainer.optim_kwargs import implementation_kwargs
from memfit_trainer.stochastic_rounding import Bf16AdamW, Bf16SGD

# Momentum for SGD (torch default is 0, which keeps no state and leaves nothing for 8-bit to save).
SGD_MOMENTUM = 0.9
# torch.optim.AdamW's default decoupled weight decay; Adam and SGD run without decay.
ADAMW_WEIGHT_DECAY = 0.01


def torch_optimizer(
    params: Iterable[nn.Parameter], training: TrainingSpec, implementation: OptimizerImplementation | None = None
) -> torch.optim.Optimizer:
    """A 32-bit torch optimizer for the training spec, stepping the way `implementation` says."""
    lr = training.learning_rate
    how = implementation_kwargs(implementation)
    if training.optimizer == OptimizerKind.ADAMW:
        return torch.optim.AdamW(params, lr=lr, weight_decay=ADAMW_WEIGHT_DECAY, **how)
    if training.optimizer == OptimizerKind.ADAM:
        return torch.optim.Adam(params, lr=lr, **how)
    return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, **how)


def bnb_optimizer(params: Iterable[torch.Tensor], training: TrainingSpec) -> torch.optim.Optimizer:
    """A bitsandbytes optimizer with blockwise 8-bit state (Dettmers et al. 2022).

    Tensors under bitsandbytes' `min_8bit_size` (4096 elements) keep 32-bit state.
    """
    import bitsandbytes as bnb

    lr = training.learning_rate
    if training.optimizer == OptimizerKind.ADAMW:
        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=ADAMW_WEIGHT_DECAY)
    if training.optimizer == OptimizerKind.ADAM:
        return bnb.optim.Adam8bit(params, lr=lr)
    return bnb.optim.SGD8bit(params, lr=lr, momentum=SGD_MOMENTUM)


def bf16_pure_optimizer(
    params: Iterable[nn.Parameter], training: TrainingSpec, *, seed: int = 0, first_index: int = 0
) -> torch.optim.Optimizer:
    """bf16-pure: bf16 state, stochastically rounded bf16 updates (memfit_trainer.stochastic_rounding), with
    the hyper-parameters of `torch_optimizer`."""
    lr = training.learning_rate
    if training.optimizer == OptimizerKind.SGD:
        return Bf16SGD(params, lr=lr, momentum=SGD_MOMENTUM, seed=seed, first_index=first_index)
    decay = ADAMW_WEIGHT_DECAY if training.optimizer == OptimizerKind.ADAMW else 0.0
    return Bf16AdamW(params, lr=lr, weight_decay=decay, seed=seed, first_index=first_index)


def replicated_optimizer(
    params: list[nn.Parameter], plan: Plan, *, seed: int = 0, first_index: int = 0
) -> torch.optim.Optimizer:
    """The plan's optimizer over whole (not sharded) parameters: 8-bit (under bf16-pure it updates the bf16
    weights in place, rounding to nearest, as torchtune's low-memory single-device recipe), bf16-pure's, or
    torch's."""
    assert plan.training is not None
    if plan.optimizer8bit:
        return bnb_optimizer(params, plan.training)
    if plan.precision == Precision.BF16_PURE:
        return bf16_pure_optimizer(params, plan.training, seed=seed, first_index=first_index)
    return torch_optimizer(params, plan.training, plan.optimizer_implementation)


def optimizer_in_backward(model: nn.Module, plan: Plan, *, seed: int = 0) -> OptimizerInBackward:
    """One optimizer of the plan's kind per trainable parameter, stepped in its post-accumulate-grad hook."""
    return OptimizerInBackward(
        model.named_parameters(),
        lambda params, index: replicated_optimizer(params, plan, seed=seed, first_index=index),
    )


class LocalShardOptimizer:
    """Runs an optimizer on the local shards of FSDP2's DTensor parameters.

    bitsandbytes kernels take plain tensors only ("got mixed torch.Tensor and DTensor"), so the inner
    optimizer sees `to_local().detach()` views that share storage with the shards, and each step
    hands it the local part of every gradient. Its state is per rank (saved per rank, not resharded).
    """

    def __init__(self, params: Iterable[nn.Parameter], training: TrainingSpec) -> None:
        from torch.distributed.tensor import DTensor

        self._dtensor = DTensor
        self.params = [p for p in params if p.requires_grad]
        self.locals = [p.to_local().detach() if isinstance(p, DTensor) else p.detach() for p in self.params]
        self.inner = bnb_optimizer(self.locals, training)

    @property
    def state(self) -> Any:
        return self.inner.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def step(self) -> None:
        for param, local in zip(self.params, self.locals, strict=True):
            grad = param.grad
            local.grad = (
                None if grad is None else (grad.to_local() if isinstance(grad, self._dtensor) else grad)
            )
        self.inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param, local in zip(self.params, self.locals, strict=True):
            param.grad = None
            local.grad = None

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

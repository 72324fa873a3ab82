"""Optimizer step fused into backward: one optimizer per parameter, stepped by the parameter's
post-accumulate-grad hook, which then frees the gradient, so no gradient outlives its own step.

Sources: PyTorch tutorial "How to save memory by fusing the optimizer step into the backward pass"
(`Tensor.register_post_accumulate_grad_hook`, one optimizer per parameter) and torchtune's
`create_optim_in_bwd_wrapper` / `OptimizerInBackwardWrapper` (the per-parameter optimizers behind one
object with state_dict()/load_state_dict() keyed by parameter name).

Valid only where the gradient a hook sees is final: one rank (no all-reduce after it), no gradient
accumulation, no loss scaling (plan_check refuses the rest). Checkpoints go through DCP, which takes the
per-parameter optimizers together (`dcp_optimizers`) and keys their state by parameter name; their
identical param groups are merged into one (`as_one_param_group`), so a checkpoint is the same as the usual
optimizer's and either resumes from the other's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

MakeOptimizer = Callable[[list[nn.Parameter], int], torch.optim.Optimizer]
"""Builds the optimizer of one parameter from ([parameter], its index among the trainable parameters)."""


def as_one_param_group(optim_state: dict[str, Any]) -> dict[str, Any]:
    """A DCP optimizer state dict of per-parameter optimizers with their param groups merged into one (they
    share every hyper-parameter: one plan made them), as one optimizer over all the parameters writes it.
    DCP's set_state_dict finds each parameter's group in it by name."""
    groups = optim_state.get("param_groups", [])
    if not groups:
        return optim_state
    settings = [{k: v for k, v in group.items() if k != "params"} for group in groups]
    if any(s != settings[0] for s in settings):
        raise ValueError("per-parameter optimizers with different hyper-parameters cannot share one param group")
    merged = {**settings[0], "params": [name for group in groups for name in group["params"]]}
    return {**optim_state, "param_groups": [merged]}


class OptimizerInBackward:
    """Per-parameter optimizers stepped in backward; `step()` and `zero_grad()` have nothing left to do."""

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], make: MakeOptimizer) -> None:
        trainable = [(name, p) for name, p in named_parameters if p.requires_grad]
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            name: make([param], index) for index, (name, param) in enumerate(trainable)
        }
        self.steps_in_backward = 0  # hook calls: one per parameter with a gradient per backward
        self._handles = [
            param.register_post_accumulate_grad_hook(self._hook(self.optimizers[name]))
            for name, param in trainable
        ]

    def _hook(self, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
        def step_and_free(param: torch.Tensor) -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # param.grad = None
            self.steps_in_backward += 1

        return step_and_free

    @property
    def state(self) -> dict[Any, Any]:
        """Every parameter's state (for the runner's facts)."""
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    @property
    def inner_class(self) -> str:
        """The class of the per-parameter optimizers."""
        return type(next(iter(self.optimizers.values()))).__name__ if self.optimizers else ""

    def dcp_optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """The per-parameter optimizers, for torch.distributed.checkpoint's get/set_state_dict."""
        return tuple(self.optimizers.values())

    def step(self) -> None:
        """Nothing: each parameter stepped when its gradient was ready."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: the hooks freed every gradient."""

    def state_dict(self) -> dict[str, Any]:
        """Each parameter's optimizer state, keyed by parameter name."""
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = set(self.optimizers) - set(state)
        if missing:
            raise KeyError(f"optimizer state has no entry for {sorted(missing)[:5]}")
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

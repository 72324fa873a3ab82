"""bf16-pure optimizers: AdamW/Adam and SGD with momentum whose state is bf16 (the parameter's dtype) and whose
parameter update is stochastically rounded to bf16, so that no fp32 master copy of the weights is kept.

Stochastic rounding makes the bf16 update unbiased in expectation, which is what lets bf16 weights train
without an fp32 master (Zamirai et al. 2020, "Revisiting BFloat16 Training", arXiv 2010.06192, §3;
torchao's `torchao.optim.AdamW(..., bf16_stochastic_round=True)` is the same idea). The state is rounded to
nearest (torchao rounds only the weights stochastically as well).

Memory: one slice of at most STEP_SLICE elements of one parameter tensor at a time (a plain loop, no
foreach), so the fp32/int32 temporaries are those of one slice. Per slice of n elements, at most three
n-element fp32 tensors exist at once:
AdamW (g32, m32, v32) while the moments update, then (p32, m32, v32) while the weights update, then p32 and
one int32 noise tensor while rounding: peak 12n bytes. SGD: (g32, b32), then (p32, b32), then p32 + noise:
peak 8n bytes. The arithmetic is torch.optim.AdamW's / SGD's single-tensor path (same bias correction,
decoupled weight decay, `exp_avg.lerp_`), done in fp32.

Rounding noise comes from a generator reseeded per (seed, step, tensor index, rank): runs are reproducible
and a resumed run continues exactly without saving any generator state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from memfit_trainer.problems.base import mix_seed

LOW_BITS = 1 << 16  # bf16 is the top 16 bits of an fp32 bit pattern
HIGH_MASK = -LOW_BITS  # 0xFFFF0000 as an int32
# Elements updated at a time: a tensor's fp32 temporaries never exceed three slices (memfit.memory's
# PURE_BF16_STEP_SLICE), also for a 128k-vocabulary embedding.
STEP_SLICE = 1 << 24


def stochastic_round_(x32: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Round fp32 `x32` to bf16-representable values in place, up with probability equal to the dropped
    fraction: add uniform random 16 low bits to the bit pattern, then truncate. The result (still fp32, low
    bits zero) converts to bf16 exactly. Needs one int32 temporary of x32's size."""
    noise = torch.randint(0, LOW_BITS, x32.shape, dtype=torch.int32, device=x32.device, generator=generator)
    bits = x32.view(torch.int32)
    bits.add_(noise).bitwise_and_(HIGH_MASK)
    return x32


def stochastic_round(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """`x` stochastically rounded to a new bf16 tensor (x itself is left alone)."""
    return stochastic_round_(x.to(torch.float32, copy=True), generator).to(torch.bfloat16)


def _slices(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """The same STEP_SLICE-element slices of equally shaped contiguous tensors, as flat views (in place
    updates of a slice update the tensor); a non-contiguous tensor is one slice."""
    if not all(t.is_contiguous() for t in tensors):
        yield tensors
        return
    flat = [t.view(-1) for t in tensors]
    for start in range(0, flat[0].numel(), STEP_SLICE):
        yield tuple(f[start:start + STEP_SLICE] for f in flat)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of an FSDP2 DTensor (a view sharing storage), else the tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _number(value: Any) -> float:
    # DCP initialises state with a zero-gradient step at lr=tensor(0.0): accept tensors too.
    return float(value.item() if isinstance(value, torch.Tensor) else value)


class _StochasticRoundingOptimizer(torch.optim.Optimizer):
    """One tensor at a time, fp32 arithmetic, bf16 state, stochastically rounded write-back."""

    def __init__(self, params: Iterable[nn.Parameter], defaults: dict[str, Any], *, seed: int,
                 first_index: int) -> None:
        super().__init__(params, defaults)
        self.seed = seed
        self.first_index = first_index  # per-parameter optimizers (optimizer in backward) draw the same noise
        self._generator: torch.Generator | None = None

    def _noise(self, index: int, step: int, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
        return self._generator.manual_seed(mix_seed(self.seed, step, self.first_index + index, _rank()))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group, index)
                index += 1
        return loss

    def _update(self, param: nn.Parameter, group: dict[str, Any], index: int) -> None:
        raise NotImplementedError


class Bf16AdamW(_StochasticRoundingOptimizer):
    """AdamW (decoupled weight decay; `weight_decay=0` is Adam) with bf16 moments and stochastically
    rounded bf16 weights; hyper-parameters as torch.optim.AdamW."""

    def __init__(self, params: Iterable[nn.Parameter], *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0, first_index: int = 0) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults, seed=seed, first_index=first_index)

    def _update(self, param: nn.Parameter, group: dict[str, Any], index: int) -> None:
        assert param.grad is not None
        lr, eps, decay = _number(group["lr"]), group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["step"] += 1
        step = int(state["step"].item())
        bias1 = 1 - beta1**step
        bias2_sqrt = math.sqrt(1 - beta2**step)
        local = _local(param)
        noise = self._noise(index, step, local.device)
        for p, g, m, v in _slices(local, _local(param.grad), _local(state["exp_avg"]), _local(state["exp_avg_sq"])):
            g32 = g.to(torch.float32, copy=True)
            m32 = m.to(torch.float32, copy=True).lerp_(g32, 1 - beta1)
            v32 = v.to(torch.float32, copy=True).mul_(beta2).addcmul_(g32, g32, value=1 - beta2)
            del g32
            m.copy_(m32)  # round to nearest
            v.copy_(v32)
            p32 = p.to(torch.float32, copy=True)
            if decay:
                p32.mul_(1 - lr * decay)  # AdamW's decoupled decay (commutes with the moment updates above)
            denom = v32.sqrt_().div_(bias2_sqrt).add_(eps)
            p32.addcdiv_(m32, denom, value=-lr / bias1)
            del m32, v32, denom
            p.copy_(stochastic_round_(p32, noise))


class Bf16SGD(_StochasticRoundingOptimizer):
    """SGD with momentum (no dampening, no Nesterov, no decay: torch.optim.SGD's path), bf16 momentum buffer
    and stochastically rounded bf16 weights."""

    def __init__(self, params: Iterable[nn.Parameter], *, lr: float, momentum: float, seed: int = 0,
                 first_index: int = 0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum}, seed=seed, first_index=first_index)

    def _update(self, param: nn.Parameter, group: dict[str, Any], index: int) -> None:
        assert param.grad is not None
        lr, momentum = _number(group["lr"]), group["momentum"]
        state = self.state[param]
        first = "momentum_buffer" not in state
        if first:
            state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["step"] = state.get("step", torch.tensor(0.0)) + 1  # the rounding noise's step
        local = _local(param)
        noise = self._noise(index, int(state["step"].item()), local.device)
        for p, g, b in _slices(local, _local(param.grad), _local(state["momentum_buffer"])):
            g32 = g.to(torch.float32, copy=True)
            if first:
                b32 = g32  # torch.optim.SGD's first step: the buffer is the gradient itself
            else:
                b32 = b.to(torch.float32, copy=True).mul_(momentum).add_(g32)
                del g32
            b.copy_(b32)
            p32 = p.to(torch.float32, copy=True).add_(b32, alpha=-lr)
            del b32
            p.copy_(stochastic_round_(p32, noise))

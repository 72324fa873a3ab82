"""What every engine adapter offers the training loop: micro-steps, optimizer steps, checkpoints, facts."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from memfit_trainer.activation_offload import activation_offload_of
from memfit_trainer.chunked_loss import loss_chunks
from memfit_trainer.optim_in_backward import OptimizerInBackward
from memfit_trainer.problems import Batch


class Runner(Protocol):
    """A model wrapped by one engine, with its optimizer, applying one Plan."""

    engine: str
    checkpoint_format: str

    def micro_step(self, batch: Batch, *, last: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch (gradient sync only when `last`); the detached loss."""
        ...

    def optimizer_step(self) -> None:
        """Apply the accumulated gradients and clear them."""
        ...

    def save(self, directory: Path, tag: str) -> None:
        """Write model and optimizer state under directory/tag (a collective call)."""
        ...

    def load(self, directory: Path, tag: str) -> None:
        """Restore model and optimizer state from directory/tag (a collective call)."""
        ...

    def facts(self) -> dict[str, Any]:
        """What was really applied, measured on the wrapped objects (for reports and tests)."""
        ...


def move_batch(
    batch: Batch, device: torch.device, float_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The batch on the device; floating inputs cast to float_dtype when the engine needs it."""
    moved: dict[str, torch.Tensor] = {}
    for name, tensor in batch.items():
        tensor = tensor.to(device, non_blocking=True)
        if float_dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(float_dtype)
        moved[name] = tensor
    return moved


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor held by this rank (the local shard of a DTensor or of a ZeRO-3 parameter)."""
    partition = getattr(tensor, "ds_tensor", None)
    if partition is not None:
        return int(partition.numel() * partition.element_size())
    to_local = getattr(tensor, "to_local", None)
    if callable(to_local):
        local = to_local()
        return int(local.numel() * local.element_size())
    return int(tensor.numel() * tensor.element_size())


def parameter_facts(module: nn.Module) -> dict[str, Any]:
    """Local parameter bytes and dtypes."""
    params = list(module.parameters())
    return {
        "param_bytes_local": sum(local_bytes(p) for p in params),
        "param_dtypes": sorted({str(getattr(p, "ds_tensor", p).dtype) for p in params}),
    }


def optimizer_state_facts(optimizer: Any) -> dict[str, Any]:
    """Optimizer class, and the dtypes, devices and bytes of its state tensors."""
    dtypes: set[str] = set()
    devices: set[str] = set()
    total = 0
    state: Mapping[Any, Any] = getattr(optimizer, "state", {}) or {}
    for per_param in state.values():
        if not isinstance(per_param, Mapping):
            continue
        for value in per_param.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                dtypes.add(str(local.dtype))
                devices.add(local.device.type)
                total += local.numel() * local.element_size()
    return {
        "optimizer_class": type(optimizer).__name__,
        "optimizer_state_dtypes": sorted(dtypes),
        "optimizer_state_devices": sorted(devices),
        "optimizer_state_bytes": total,
    }


def technique_facts(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """Whether the optimizer steps in backward (its per-parameter optimizers' class, and how many hook steps
    ran) and whether the loss runs chunked, read from the objects the runner trains with."""
    chunks = loss_chunks(model)
    facts: dict[str, Any] = {
        "optimizer_in_backward": isinstance(optimizer, OptimizerInBackward),
        "chunked_loss": chunks > 0,
        "loss_chunks": chunks,
        "activation_offload": activation_offload_of(model) is not None,
    }
    if isinstance(optimizer, OptimizerInBackward):
        facts |= {
            "optimizer_inner_class": optimizer.inner_class,
            "optimizers_in_backward": len(optimizer.optimizers),
            "steps_in_backward": optimizer.steps_in_backward,
        }
    return facts


def scaled_backward(loss: torch.Tensor, *, accumulation: int, scaler: Any | None) -> None:
    """Backward of one micro-batch's share of the step's loss, through the fp16 GradScaler when there is one
    (DDP's torch.amp.GradScaler, FSDP's ShardedGradScaler)."""
    scaled = loss / accumulation
    (scaler.scale(scaled) if scaler is not None else scaled).backward()


def scaled_step(optimizer: torch.optim.Optimizer, scaler: Any | None) -> None:
    """The optimizer step (skipped by the scaler on inf/NaN gradients), then the gradients freed."""
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)

"""torch.distributed.checkpoint for DDP and FSDP: sharded, resharding-capable model and optimizer state.

The per-parameter optimizers of an optimizer stepped in backward go to DCP together (its state dict helpers
take several optimizers): the checkpoint holds the same parameter-name-keyed state as one optimizer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from memfit_trainer.optim import LocalShardOptimizer
from memfit_trainer.optim_in_backward import OptimizerInBackward, as_one_param_group
from memfit_trainer.strategies.base import scaled_step


def _rank_file(directory: Path, tag: str) -> Path:
    return directory / tag / f"optimizer-rank{dist.get_rank() if dist.is_initialized() else 0}.pt"


def _options(model: nn.Module) -> StateDictOptions:
    # A model with frozen parameters (LoRA/QLoRA) checkpoints only what trains: the frozen base is
    # rebuilt from the problem (its seed or its weights), and a 4-bit base's quantisation state is not
    # something DCP can restore into the Params4bit layers.
    frozen = any(not p.requires_grad for p in model.parameters())
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def _optimizer_state(model: nn.Module, optimizer: Any, options: StateDictOptions) -> tuple[Any, Any, Any]:
    """(model state, optimizer state, what set_state_dict takes as the optimizers): per-parameter optimizers
    (in backward) as one optimizer's state (memfit_trainer.optim_in_backward)."""
    if isinstance(optimizer, OptimizerInBackward):
        optimizers = optimizer.dcp_optimizers()
        model_state, optim_state = get_state_dict(model, optimizers, options=options)
        return model_state, as_one_param_group(optim_state), optimizers
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return model_state, optim_state, optimizer


def save_dcp(model: nn.Module, optimizer: Any, directory: Path, tag: str) -> None:
    """Model (+ torch optimizer) through DCP; an 8-bit shard optimizer's state per rank beside it."""
    target = directory / tag
    options = _options(model)
    if isinstance(optimizer, LocalShardOptimizer):
        model_state, _ = get_state_dict(model, [], options=options)
        dcp.save({"model": model_state}, checkpoint_id=str(target))
        torch.save(optimizer.state_dict(), _rank_file(directory, tag))
        return
    model_state, optim_state, _ = _optimizer_state(model, optimizer, options)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(target))


def load_dcp(model: nn.Module, optimizer: Any, directory: Path, tag: str) -> None:
    """Restore what save_dcp wrote (DCP reshards to the current world size)."""
    target = directory / tag
    options = _options(model)
    if isinstance(optimizer, LocalShardOptimizer):
        model_state, _ = get_state_dict(model, [], options=options)
        state = {"model": model_state}
        dcp.load(state, checkpoint_id=str(target))
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={}, options=options)
        optimizer.load_state_dict(torch.load(_rank_file(directory, tag), weights_only=False))
        return
    model_state, optim_state, optimizers = _optimizer_state(model, optimizer, options)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(target))
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)


class DcpRunnerSteps:
    """The optimizer step and the checkpoints of a runner with a torch optimizer (gradients possibly
    scaled for fp16) and DCP checkpoints: DDP and FSDP, which differ only in the module they checkpoint
    (`checkpointed`: DDP's unwrapped module, FSDP's sharded model)."""

    optimizer: Any
    scaler: Any | None

    def checkpointed(self) -> nn.Module:
        raise NotImplementedError

    def optimizer_step(self) -> None:
        scaled_step(self.optimizer, self.scaler)

    def save(self, directory: Path, tag: str) -> None:
        save_dcp(self.checkpointed(), self.optimizer, directory, tag)

    def load(self, directory: Path, tag: str) -> None:
        load_dcp(self.checkpointed(), self.optimizer, directory, tag)

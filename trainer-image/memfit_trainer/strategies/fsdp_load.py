"""Pretrained weights into an FSDP2 model from rank 0 alone: the other ranks build the model on the meta
device, `fully_shard` it, allocate their (empty) shards and receive them from rank 0's full state dict
(`set_model_state_dict(..., broadcast_from_rank0=True)`). No rank but rank 0 ever holds the whole model,
which is what lets a model larger than a node's host memory per rank be fine-tuned with FSDP.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn


def load_from_rank0(model: nn.Module, full: Mapping[str, torch.Tensor] | None, device: torch.device) -> None:
    """Fill `model` (already `fully_shard`ed) on every rank from `full`, rank 0's state dict (None on the
    other ranks, whose parameters and buffers are on the meta device). Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if full is None:
        # Sharded parameters stay where FSDP keeps them (the host, with CPU offload): to_empty on the
        # device of an existing shard of rank 0 would not be known here, so use the mesh's device.
        model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(full or {}), options=options)
    # Buffers outside the state dict (rotary inv_freq): rank 0's values.
    for buffer in model.buffers():
        dist.broadcast(buffer.data, src=0)

"""Checkpoint writes: the bytes one checkpoint puts on storage from the busiest node, and their seconds.

What the trainer saves (trainer-image/memfit_trainer/strategies/dcp.py and deepspeed.py):
- DDP and FSDP, through torch.distributed.checkpoint: the model's state dict -- fp32, as both keep fp32
  weights (DDP under autocast, FSDP2's sharded parameters; memory/states.py) -- and the optimizer's state;
  a LoRA/QLoRA model only its trainable adapters (`ignore_frozen_params`: the frozen base is rebuilt).
- DeepSpeed `save_checkpoint`: the module's weights (16-bit under mixed precision; the frozen base too)
  and the ZeRO optimizer's fp32 master copy and moments (memory/states.py for the bytes per parameter).
Sharded state (FSDP; the optimizer at ZeRO >= 1; the weights at ZeRO-3) is written by every rank, its own
shard, in parallel (DCP's per-rank items, DeepSpeed's `zero_pp_rank_*` files), so each node writes its
share. Replicated state is written once (DCP de-duplicates it, DeepSpeed's rank 0 writes the module):
conservatively all from one node. The slowest node decides, at the pool's `host.checkpointWriteGBps`.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.common import Engine, PeftMethod
from memfit.memory.shape import Shape
from memfit.memory.states import FP32_MASTER_BYTES, optimizer_state_bytes_per_param
from memfit.memory.strategy import Strategy

# A node's write bandwidth to the checkpoint volume when the pool does not say: an AWS EBS gp3 volume's
# baseline throughput, 125 MiB/s (= 0.131 GB/s; provisionable up to 1,000 MiB/s and more), rounded down.
# Source: AWS, "Amazon EBS General Purpose SSD volumes" (gp3 baseline 125 MiB/s) and the EC2 API's
# CreateVolume `Throughput` (valid range from 125 MiB/s). Most network volumes and NFS shares a pod
# mounts are no faster per client without tuning, so the default errs towards costly writes.
DEFAULT_CHECKPOINT_WRITE_GBPS = 0.125
GB = 1e9  # the field is in GB/s: 10^9 bytes


@dataclass(frozen=True, slots=True)
class CheckpointBytes:
    """One checkpoint of a configuration: state written once, and state every rank writes a shard of."""

    replicated_bytes: float
    sharded_bytes: float

    def per_node(self, nodes: int) -> float:
        """Bytes the busiest node writes (the replicated state and its share of the shards)."""
        return self.replicated_bytes + self.sharded_bytes / max(1, nodes)


def checkpoint_bytes(shape: Shape, strategy: Strategy, *, trainable: int) -> CheckpointBytes:
    """What one checkpoint of `strategy` writes (`trainable`: the parameters the optimizer steps, the
    adapters' for LoRA/QLoRA)."""
    config = strategy.config
    kind, eight_bit = strategy.optimizer, config.optimizer8bit
    small = min(trainable, shape.small_trainable) if config.peft == PeftMethod.NONE else 0
    # bitsandbytes keeps 32-bit state for tensors under 4096 elements (memory/states.py).
    optimizer = (optimizer_state_bytes_per_param(kind, eight_bit=eight_bit) * (trainable - small)
                 + optimizer_state_bytes_per_param(kind, eight_bit=False) * small)
    if config.engine == Engine.DEEPSPEED:
        weights = (2.0 if strategy.mixed_precision else 4.0) * shape.parameters + shape.buffer_bytes
        if strategy.mixed_precision or config.zero_stage >= 1:
            optimizer += FP32_MASTER_BYTES * trainable
        sharded = (weights if config.zero_stage == 3 else 0.0) + (optimizer if config.zero_stage >= 1 else 0.0)
        return CheckpointBytes(weights + optimizer - sharded, sharded)
    stored = trainable if config.peft != PeftMethod.NONE else shape.parameters
    weights = 4.0 * stored + shape.buffer_bytes
    if config.engine == Engine.FSDP:
        return CheckpointBytes(0.0, weights + optimizer)
    return CheckpointBytes(weights + optimizer, 0.0)


def write_seconds(bytes_per_node: float, *, write_gbps: float) -> float:
    """Seconds to write `bytes_per_node` at `write_gbps` GB/s."""
    return bytes_per_node / (write_gbps * GB)

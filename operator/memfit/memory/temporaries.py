"""Transient buffers that do not scale with the micro-batch: 16-bit weight copies, gathered
parameters, gradient buckets and optimizer-step scratch space.

Sources: DeepSpeed gradient buckets as memfit_trainer configures them, the Hugging Face "auto" sizes
`reduce_bucket_size = h²` and `stage3_prefetch_bucket_size = 0.9 h²` (transformers
integrations/deepspeed.py), held twice with `overlap_comm` on CUDA (stage_1_and_2.py `ipg_buffer`);
ZeRO-3 `stage3_max_live_parameters=1e9` and the estimator's `4 x L_max` largest-layer term
(deepspeed/runtime/zero/stage3.py); DDP's reducer allocates flat gradient buckets the size of all
gradients unless `gradient_as_bucket_view=True` (torch/nn/parallel/distributed.py); FSDP2 all-gathers one unit ahead
(forward/backward prefetch) and keeps the root unit gathered (torch.distributed.fsdp `fully_shard`
sets `reshard_after_forward=False` on the root); torch's foreach AdamW allocates one fp32 temporary of
the parameter group for `exp_avg_sq.sqrt()` (torch/optim/adamw.py `_multi_tensor_adamw`), the
bitsandbytes and DeepSpeed FusedAdam kernels update in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.common import Checkpointing, Engine, Offload
from memfit.api.job import OptimizerKind
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy

# DeepSpeed gradient buffers with overlap_comm (two buckets in flight) on CUDA.
DS_BUCKETS_IN_FLIGHT = 2
# ZeRO-3 prefetch bucket relative to h² (Hugging Face "auto": 0.9 h²).
DS_PREFETCH_BUCKET_FACTOR = 0.9
# DeepSpeed ZeRO-3 `stage3_max_live_parameters` (elements gathered at once).
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
# FSDP2 all-gathers the next unit while the current one computes (implicit prefetch): two units live.
FSDP_LIVE_UNITS = 2


@dataclass(frozen=True, slots=True)
class FixedTemporaries:
    """Micro-batch-independent transient bytes per GPU, by training phase."""

    backward_bytes: float  # alive together with the activations (forward/backward)
    step_bytes: float  # alive during the optimizer step, after activations are freed
    first_gradient_bytes: float  # gradients already allocated when the activation peak occurs
    persistent_bytes: float = 0.0  # engine buffers alive throughout (DDP gradient buckets)


def _head_parameters(shape: Shape) -> int:
    return shape.vocab * shape.hidden


def _foreach_step(shape: Shape, strategy: Strategy, shards: int) -> float:
    # torch foreach AdamW: one fp32 temporary of the (local) trainable parameters; SGD and
    # bitsandbytes update in place.
    if strategy.optimizer8bit or strategy.optimizer == OptimizerKind.SGD:
        return 0.0
    return 4.0 * shape.trainable / shards


def fixed_temporaries(shape: Shape, strategy: Strategy) -> FixedTemporaries:
    """Transient bytes of `strategy` that do not depend on the micro-batch."""
    if strategy.engine == Engine.DDP:
        return _ddp(shape, strategy)
    if strategy.engine == Engine.FSDP:
        return _fsdp(shape, strategy)
    return _deepspeed(shape, strategy)


def _ddp(shape: Shape, strategy: Strategy) -> FixedTemporaries:
    backward = 0.0
    if strategy.mixed_precision:
        # torch.autocast caches a 16-bit copy of each matmul weight; backward keeps the copies of
        # every block whose activations are saved (one block at a time under full checkpointing).
        blocks = 1 if strategy.checkpointing == Checkpointing.FULL else shape.layers
        backward = 2.0 * (blocks * shape.block_parameters + _head_parameters(shape))
    # With accumulation 1 and zero_grad(set_to_none=True) gradients appear as backward frees
    # activations; the head's fp32 gradient is the first, at the activation peak.
    first = 4.0 * (_head_parameters(shape) or shape.block_parameters)
    # The reducer's flat fp32 buckets hold a copy of every gradient (gradient_as_bucket_view=False).
    buckets = 4.0 * shape.trainable
    return FixedTemporaries(backward, _foreach_step(shape, strategy, 1), first, buckets)


def _fsdp(shape: Shape, strategy: Strategy) -> FixedTemporaries:
    n = strategy.world_size
    param_bytes = 2.0 if strategy.mixed_precision else 4.0
    reduce_extra = 4.0 if strategy.mixed_precision else 0.0  # reduce_dtype fp32 copy for reduce-scatter
    if strategy.zero_stage == 3:
        gathered = (shape.root_parameters + FSDP_LIVE_UNITS * shape.block_parameters) * param_bytes
    else:
        gathered = shape.parameters * param_bytes  # SHARD_GRAD_OP: kept gathered until backward
    unit = max(shape.block_parameters, shape.root_parameters)
    unsharded_grads = unit * (param_bytes + reduce_extra)
    step = 0.0 if strategy.offload == Offload.CPU else _foreach_step(shape, strategy, n)
    return FixedTemporaries(gathered + unsharded_grads, step, 0.0)


def _deepspeed(shape: Shape, strategy: Strategy) -> FixedTemporaries:
    weight_bytes = 2.0 if strategy.mixed_precision else 4.0
    square = float(shape.hidden * shape.hidden)
    buckets = DS_BUCKETS_IN_FLIGHT * min(square, shape.trainable) * weight_bytes
    if strategy.zero_stage == 0:
        first = weight_bytes * (_head_parameters(shape) or shape.block_parameters)
        return FixedTemporaries(0.0, 0.0, first)
    if strategy.zero_stage in (1, 2):
        return FixedTemporaries(buckets, 0.0, 0.0)
    live = min(DS_MAX_LIVE_PARAMETERS, max(2 * shape.block_parameters, shape.largest_layer))
    prefetch = DS_PREFETCH_BUCKET_FACTOR * square * weight_bytes
    gathered = max(live * weight_bytes + prefetch + buckets, 4.0 * shape.largest_layer)
    return FixedTemporaries(gathered, 0.0, 0.0)

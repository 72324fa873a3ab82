"""Bytes that do not scale with the micro-batch, by training phase: gradients as they exist in each
phase, gathered parameters, engine buffers and optimizer-step scratch space.

Each engine's phases were read from allocator-level timelines of real steps (the live tensors at the
peak, grouped by the op that allocated them: docs/memory-model.md "How the phases were checked") and
from the sources cited per rule:

- DDP (world size 2+; memfit-trainer runs world size 1 bare): the reducer keeps flat fp32 buckets the
  size of all gradients and, with `gradient_as_bucket_view=True`, the gradients are views into them
  (torch/nn/parallel/distributed.py), alive for the whole step; torch.autocast caches a 16-bit copy of each
  matmul weight while the graph that uses it is alive.
- FSDP2 (`fully_shard`): fp32 sharded parameters and gradients; FULL_SHARD re-shards every unit after
  its forward, so at the activation peak (the start of backward) no unit is gathered; SHARD_GRAD_OP
  (`reshard_after_forward=False`) keeps every unit gathered in the compute dtype until its backward.
  During backward one unit is gathered ahead of the one computing (prefetch) and each unit's
  gradient exists unsharded (plus an fp32 copy for `reduce_dtype`) until its reduce-scatter.
- DeepSpeed ZeRO (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; bf16_optimizer.py): no gradient
  exists at the start of backward; the fp32 gradient partition is built for the step
  (`single_partition_of_fp32_groups[i].grad`) and freed after it, and ZeRO-0 with bf16 also still holds
  the 16-bit gradients then; ZeRO-2 (`contiguous_gradients`) allocates its 16-bit gradient partition
  buffer at the first reduction of backward; ZeRO-3 keeps a persistent 16-bit gradient partition and, with
  `stage3_max_reuse_distance`/`stage3_max_live_parameters` at their 1e9 defaults, keeps parameters
  gathered between forward and backward (up to `max_live` elements). On CUDA, `overlap_comm` holds two
  reduce buckets (`reduce_bucket_size = h²`, the Hugging Face "auto" value).
- Optimizer step, by implementation (`optimizerImplementation`; unset: the library's default, torch's
  `_default_to_fused_or_foreach` -- foreach for CUDA tensors, the per-tensor loop on a CPU -- and
  DeepSpeed's FusedAdam on CUDA). Adam/AdamW: `fused` (torch `_fused_adamw_`, DeepSpeed FusedAdam)
  updates in place; `foreach` (torch/optim/adam.py `_multi_tensor_adam`) allocates one fp32 temporary of
  the (local) parameter list for `exp_avg_sq.sqrt()` and divides it in place; the per-tensor loop
  (`_single_tensor_adam`) computes `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: the
  square root and the quotient of one tensor (2 x 4 B x its size), while `denom` still holds the previous
  tensor's quotient -- three tensors' worth where equal matrices are adjacent (a gated MLP's gate, up and
  down projections have no bias between them); DeepSpeed's flat fp32 partition is one tensor. Measured
  on this CPU with the allocator meter (docs/techniques.md). bitsandbytes' CUDA kernels update in place;
  its CPU 8-bit step dequantises both states and its update (5 x 4 B). SGD with momentum (no weight
  decay) updates in place in every implementation. gloo has no native reduce-scatter: FSDP2 on CPU keeps one
  unsharded fp32 gradient copy of a unit into the step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.api.common import Checkpointing, Engine, Offload, OptimizerImplementation
from memfit.api.job import OptimizerKind
from memfit.memory.shape import Shape
from memfit.memory.strategy import Device, Strategy

# DeepSpeed gradient buffers with overlap_comm (two buckets in flight), CUDA only (memfit_trainer
# turns overlap_comm off on CPU).
DS_BUCKETS_IN_FLIGHT = 2
# ZeRO-3 prefetch bucket relative to h² (Hugging Face "auto": 0.9 h²).
DS_PREFETCH_BUCKET_FACTOR = 0.9
# Checkpointing that recomputes whole blocks: their matmuls' autocast weight copies are not saved.
WHOLE_BLOCK = (Checkpointing.FULL, Checkpointing.SELECTIVE_OP)
# DeepSpeed ZeRO-1/2 step prologue: bytes per local element alive beside the fp32 gradient partition.
DS_STEP_PROLOGUE_BYTES = 4.0
# DeepSpeed ZeRO-3 `sub_group_size` (its default; memfit_trainer keeps it): the optimizer steps one sub-group
# of local elements at a time, its fp32 gradient made just before and freed just after (stage3.py `step`).
DS_SUB_GROUP_ELEMENTS = 1_000_000_000
# DeepSpeed ZeRO-3 `stage3_max_live_parameters` (elements gathered at once).
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
# FSDP2 all-gathers the next unit while the current one computes (implicit prefetch): two units live.
FSDP_LIVE_UNITS = 2
# torch Adam(W) per-tensor loop: sqrt and division of one fp32 tensor alive together (the previous
# tensor's quotient too, `adam_scratch`).
LOOP_ADAM_TEMPORARIES = 2
# bitsandbytes' CPU 8-bit step: both states dequantised, the update and two scratch buffers (fp32).
CPU_BNB_TEMPORARIES = 5
# memfit_trainer's stochastically rounded bf16 step (memfit_trainer.stochastic_rounding), one slice of at
# most PURE_BF16_STEP_SLICE elements of one tensor at a time on every device: at most three fp32 copies
# alive at once for AdamW (gradient and moments, then weight and moments, then weight and the rounding's
# int32 noise), two for SGD with momentum, in 4-byte units of the slice.
PURE_BF16_STEP_TEMPORARIES = 3
PURE_BF16_STEP_SLICE = 1 << 24


@dataclass(frozen=True, slots=True)
class PhaseBytes:
    """Micro-batch-independent bytes per GPU, by the phase in which they are alive."""

    persistent_bytes: float  # engine buffers alive in every phase (DDP buckets, ZeRO-3 grad partition)
    with_activations_bytes: float  # alive at the activation peak (gathered weights, autocast copies)
    # Once backward is past the loss (first block's backward): gradients made so far (the head's, or a
    # gradient buffer), and other bytes (gathered units, unsharded gradients of the unit).
    in_backward_gradient_bytes: float
    in_backward_bytes: float
    # In the last block's backward: nearly every gradient, and other bytes (its unit, its autocast
    # copies). Both replace `with_activations_bytes`, which by then is gone.
    late_gradient_bytes: float
    late_backward_bytes: float
    held_gradient_bytes: float  # gradients kept across micro-steps when accumulating
    backward_end_bytes: float  # gradients and buffers alive when backward finishes
    step_gradient_bytes: float  # gradients alive during the optimizer step
    step_temporary_bytes: float  # optimizer-step scratch space
    # The optimizer step in backward: the head's step (its gradient and scratch) with every activation
    # still saved, and a block tensor's with the block's recomputed activations (predict.py adds each as
    # one more activation moment).
    head_step_bytes: float = 0.0
    block_step_bytes: float = 0.0
    # The chunked loss: bytes alive only while the loss's chunks run backward (the head's gradient filling
    # in over the chunks; under autocast the recomputed chunk's own 16-bit copy of the head weight).
    loss_extra_bytes: float = 0.0


def _head_parameters(shape: Shape) -> int:
    return shape.vocab * shape.hidden


def _late_share(shape: Shape) -> float:
    """Share of the trainable parameters whose gradients exist when the last block runs backward:
    the other blocks' and the head's (the embeddings' come after)."""
    done = (shape.layers - 1) * shape.block_parameters + _head_parameters(shape)
    return min(1.0, done / shape.trainable) if shape.trainable else 0.0


def _largest_tensor(shape: Shape) -> float:
    # The largest module's parameters stand for its largest tensor (its weight; the bias is h).
    return float(shape.largest_layer or shape.block_parameters)


def implementation(strategy: Strategy) -> OptimizerImplementation:
    """How the 32-bit step runs: the configuration's choice, else the library's default on the device."""
    chosen = strategy.config.optimizer_implementation
    if chosen is not None:
        return chosen
    if strategy.device == Device.CUDA:
        return OptimizerImplementation.FUSED if strategy.config.engine == Engine.DEEPSPEED else OptimizerImplementation.FOREACH
    return OptimizerImplementation.FOR_LOOP


def adam_scratch(strategy: Strategy, *, elements: float, largest: float, adjacent: float = 0.0) -> float:
    """Temporaries of a 32-bit torch/DeepSpeed step over `elements` local parameters whose largest tensor
    has `largest` elements; `adjacent`: elements of the largest previous-plus-current pair the loop meets
    (the previous quotient alive with the current one's two). SGD with momentum: none."""
    if strategy.optimizer == OptimizerKind.SGD:
        return 0.0
    chosen = implementation(strategy)
    if chosen == OptimizerImplementation.FUSED:
        return 0.0
    if chosen == OptimizerImplementation.FOREACH:
        return 4.0 * elements
    return 4.0 * min(elements * LOOP_ADAM_TEMPORARIES, max(LOOP_ADAM_TEMPORARIES * largest, adjacent))


def _adjacent_matrices(shape: Shape) -> float:
    """The per-tensor loop's worst adjacent pair: a gated MLP's matrices follow one another with no bias
    between them (the previous quotient and the current square root and quotient: 3 matrices)."""
    return 3.0 * shape.hidden * shape.ffn if shape.gated_mlp else 0.0


def _step_scratch(shape: Shape, strategy: Strategy, *, elements: float, flat: bool) -> float:
    """Optimizer-step temporaries over `elements` local parameters held as one flat tensor or many."""
    if strategy.pure_bf16 and not strategy.config.optimizer8bit:
        # A per-tensor loop on every device; SGD keeps the weight, gradient and momentum copies.
        per = PURE_BF16_STEP_TEMPORARIES if strategy.optimizer != OptimizerKind.SGD else PURE_BF16_STEP_TEMPORARIES - 1
        return per * 4.0 * min(elements, _largest_tensor(shape), PURE_BF16_STEP_SLICE)
    if strategy.config.optimizer8bit:
        if strategy.optimizer == OptimizerKind.SGD or strategy.device == Device.CUDA:
            return 0.0  # bitsandbytes' CUDA kernels update in place
        largest = elements if flat else min(elements, _largest_tensor(shape))
        return CPU_BNB_TEMPORARIES * 4.0 * largest
    if flat:
        return adam_scratch(strategy, elements=elements, largest=elements)
    # Sharded (FSDP2's DTensors), each tensor is its local part: the adjacent pair shrinks with the share.
    share = min(1.0, elements / shape.trainable) if shape.trainable else 1.0
    return adam_scratch(strategy, elements=elements, largest=min(elements, _largest_tensor(shape)),
                        adjacent=_adjacent_matrices(shape) * share)


def phase_bytes(shape: Shape, strategy: Strategy) -> PhaseBytes:
    """The phase terms of `strategy` (see the module docstring for each rule)."""
    if strategy.config.engine == Engine.DDP:
        phases = _ddp(shape, strategy)
    elif strategy.config.engine == Engine.FSDP:
        phases = _fsdp(shape, strategy)
    else:
        phases = _deepspeed(shape, strategy)
    if strategy.config.chunked_loss and shape.vocab:
        phases = replace(phases, loss_extra_bytes=_chunked_loss_extra(shape, strategy))
    return phases


def _chunked_loss_extra(shape: Shape, strategy: Strategy) -> float:
    """What only the chunked loss's backward holds: every chunk adds its part of the head's gradient (the
    hook that consumes it fires once, after the last chunk), in the dtype the engine keeps gradients in
    (DDP's reducer buckets hold them at world size 2+), and autocast, whose weight cache is off while a
    checkpoint recomputes, casts the head weight once more per chunk."""
    config, head = strategy.config, float(_head_parameters(shape))
    if config.engine == Engine.DDP:
        grad = 0.0 if (strategy.world_size > 1 and not config.optimizer_in_backward) else (
            2.0 if strategy.pure_bf16 else 4.0)
    else:
        grad = 2.0 if strategy.half_weights else 4.0
    autocast_copy = 2.0 if (strategy.mixed_precision and config.engine == Engine.DDP) else 0.0
    return (grad + autocast_copy) * head


def _ddp(shape: Shape, strategy: Strategy) -> PhaseBytes:
    t = float(shape.trainable)
    grad_bytes = 2.0 if strategy.pure_bf16 else 4.0
    if strategy.config.optimizer_in_backward:
        return _step_in_backward(shape, strategy, grad_bytes)
    with_activations = 0.0
    if strategy.mixed_precision:
        # torch.autocast caches a 16-bit copy of each matmul weight; backward keeps the copies of
        # every block whose activations are saved (one block at a time under full checkpointing).
        blocks = 1 if strategy.config.activation_checkpointing in WHOLE_BLOCK else shape.layers
        with_activations = 2.0 * (blocks * shape.block_parameters + _head_parameters(shape))
    late_copies = 2.0 * shape.block_parameters if strategy.mixed_precision else 0.0
    scratch = _step_scratch(shape, strategy, elements=t, flat=False)
    grads = grad_bytes * t
    if strategy.world_size > 1:
        # memfit-trainer wraps the model in DDP only at world size 2+, with gradient_as_bucket_view:
        # the gradients are views into the reducer's fp32 buckets, allocated with the wrapper and
        # alive in every phase; no second copy (torch DDP docs, gradient_as_bucket_view).
        return PhaseBytes(
            persistent_bytes=grads, with_activations_bytes=with_activations,
            in_backward_gradient_bytes=0.0, in_backward_bytes=0.0, late_gradient_bytes=0.0,
            late_backward_bytes=late_copies, held_gradient_bytes=0.0, backward_end_bytes=0.0,
            step_gradient_bytes=0.0, step_temporary_bytes=scratch,
        )
    # World size 1: the bare model (no reducer); backward creates the gradients, zero_grad frees them.
    return PhaseBytes(
        persistent_bytes=0.0,
        with_activations_bytes=with_activations,
        in_backward_gradient_bytes=grad_bytes * _head_parameters(shape),
        in_backward_bytes=0.0,
        late_gradient_bytes=grads * _late_share(shape),
        # The other blocks' autocast copies went with their graphs; the last block's are still there.
        late_backward_bytes=late_copies,
        held_gradient_bytes=grads,
        backward_end_bytes=grads,
        step_gradient_bytes=grads,
        step_temporary_bytes=scratch,
    )


def _step_in_backward(shape: Shape, strategy: Strategy, grad_bytes: float) -> PhaseBytes:
    """DDP on one GPU with the optimizer step in each parameter's post-accumulate-grad hook: a gradient
    lives only until its own step, so no phase holds the gradients. A step holds one tensor's gradient
    and its scratch (one-tensor optimizers: foreach over one tensor on CUDA, the per-tensor loop on the
    CPU): a block tensor's right after its gradient (the block's backward temporaries gone by then, its
    recomputed activations not yet); the head's right after the loss's backward (every activation still
    saved); the embedding's at the very end (none left). The first two are activation moments of their
    own (predict.py), beside the backward's."""
    def working(elements: float) -> float:
        return grad_bytes * elements + _step_scratch(shape, strategy, elements=elements, flat=True)

    block_tensor = float(max(shape.ffn * shape.hidden, (shape.hidden + 2 * shape.kv_hidden) * shape.hidden))
    largest = working(_largest_tensor(shape))
    with_activations = 0.0
    if strategy.mixed_precision:
        blocks = 1 if strategy.config.activation_checkpointing in WHOLE_BLOCK else shape.layers
        with_activations = 2.0 * (blocks * shape.block_parameters + _head_parameters(shape))
    late_copies = 2.0 * shape.block_parameters if strategy.mixed_precision else 0.0
    return PhaseBytes(
        persistent_bytes=0.0, with_activations_bytes=with_activations, in_backward_gradient_bytes=0.0,
        in_backward_bytes=0.0, late_gradient_bytes=0.0, late_backward_bytes=late_copies, held_gradient_bytes=0.0,
        backward_end_bytes=largest, step_gradient_bytes=0.0, step_temporary_bytes=0.0,
        head_step_bytes=largest, block_step_bytes=working(block_tensor),
    )


def _fsdp(shape: Shape, strategy: Strategy) -> PhaseBytes:
    n = strategy.world_size
    t = float(shape.trainable)
    param_bytes = 2.0 if strategy.half_weights else 4.0
    # reduce_dtype fp32 copy for reduce-scatter (bf16-pure reduces its bf16 gradients as they are)
    reduce_extra = 4.0 if strategy.mixed_precision else 0.0
    unit = float(max(shape.block_parameters, shape.root_parameters))
    unsharded_grads = unit * (param_bytes + reduce_extra)
    if strategy.config.zero_stage == 3:
        with_activations = 0.0
        gathered_late = FSDP_LIVE_UNITS * unit * param_bytes
    else:
        with_activations = gathered_late = shape.parameters * param_bytes
    offloaded = strategy.config.offload == Offload.CPU
    sharded_grads = 0.0 if offloaded else (2.0 if strategy.pure_bf16 else 4.0) * t / n
    step_scratch = 0.0 if offloaded else _step_scratch(shape, strategy, elements=t / n, flat=False)
    if strategy.device == Device.CPU and n > 1:
        # gloo reduce-scatter emulation keeps one unsharded gradient (fp32; bf16 under bf16-pure)
        step_scratch += (2.0 if strategy.pure_bf16 else 4.0) * unit
    # In a block's backward: the block (and the next, prefetched) gathered, its unsharded gradients.
    in_backward = unsharded_grads + (gathered_late if strategy.config.zero_stage == 3 else 0.0)
    return PhaseBytes(
        persistent_bytes=0.0,
        with_activations_bytes=with_activations,
        in_backward_gradient_bytes=0.0,
        in_backward_bytes=in_backward,
        late_gradient_bytes=sharded_grads * _late_share(shape),
        late_backward_bytes=FSDP_LIVE_UNITS * unit * param_bytes + unsharded_grads,
        held_gradient_bytes=sharded_grads,
        backward_end_bytes=sharded_grads + gathered_late + unsharded_grads,
        step_gradient_bytes=sharded_grads,
        step_temporary_bytes=step_scratch,
    )


def _deepspeed(shape: Shape, strategy: Strategy) -> PhaseBytes:
    n, stage = strategy.world_size, strategy.config.zero_stage
    p, t = float(shape.parameters), float(shape.trainable)
    weight_bytes = 2.0 if strategy.mixed_precision else 4.0
    square = float(shape.hidden * shape.hidden)
    buckets = 0.0
    if strategy.device == Device.CUDA and stage >= 1:
        buckets = DS_BUCKETS_IN_FLIGHT * min(square, t) * weight_bytes
    offloaded = strategy.config.offload != Offload.NONE
    # 16-bit gradients as backward produces them (ZeRO-2/3 keep only the partition).
    low_grads = weight_bytes * t / (n if stage >= 2 else 1)
    fp32_master = strategy.mixed_precision or stage >= 1
    # Elements stepped at once: ZeRO-3 steps one sub-group at a time (closed at the parameter that
    # reaches `sub_group_size`), the other stages the whole local partition.
    stepped = t / (n if stage >= 1 else 1)
    if stage == 3:
        stepped = min(stepped, DS_SUB_GROUP_ELEMENTS + _largest_tensor(shape) / n)
    if stage == 0:
        # fp32: the model's own gradients; bf16/fp16: 16-bit gradients and their fp32 copies.
        step_grads = 4.0 * t + (low_grads if strategy.mixed_precision else 0.0)
    else:
        step_grads = 0.0 if offloaded else 4.0 * stepped  # fp32 gradient partition (on the host if offloaded)
    step_scratch = 0.0
    if not offloaded:
        step_scratch = _step_scratch(shape, strategy, elements=stepped, flat=stage >= 1 and fp32_master)
        if stage == 3 and strategy.mixed_precision:
            # The sub-group's prologue (stage3.py `_prepare_fp32_grad_for_sub_group`): its 16-bit gradients
            # flattened into one copy, then cast to the fp32 gradient -- the flat copy is alive beside it
            # until the cast is done (in fp32 the flat copy is the gradient itself).
            step_scratch = max(step_scratch, weight_bytes * stepped)
        if stage in (1, 2):
            # The step's prologue (stage_1_and_2.py `step`): the partition's gradients, flattened into one
            # copy and cast to the fp32 partition gradient, are alive with it until the cast is done -- 4 B
            # per local element beyond the fp32 gradient whether 16-bit (2 + 2) or fp32 (the flat copy is
            # the fp32 gradient; the per-parameter ones, 4). A fused step adds nothing after it.
            step_scratch = max(step_scratch, DS_STEP_PROLOGUE_BYTES * t / n)
    persistent = 0.0
    with_activations = 0.0
    if stage == 3:
        persistent = low_grads  # the 16-bit gradient partition buffer
        live = min(DS_MAX_LIVE_PARAMETERS, p)
        with_activations = live * weight_bytes + DS_PREFETCH_BUCKET_FACTOR * square * weight_bytes
    head_grads = weight_bytes * _head_parameters(shape)
    if stage == 2:
        # contiguous_gradients: the gradient partition buffer is allocated at the first reduction.
        in_backward, late_grads, late = head_grads + low_grads, low_grads, buckets
    elif stage == 3:
        in_backward, late_grads, late = head_grads, 0.0, buckets + weight_bytes * shape.block_parameters
    else:
        in_backward, late_grads, late = head_grads, low_grads * _late_share(shape), buckets
    return PhaseBytes(
        persistent_bytes=persistent,
        with_activations_bytes=with_activations + buckets,
        in_backward_gradient_bytes=in_backward,
        in_backward_bytes=0.0,
        late_gradient_bytes=late_grads,
        late_backward_bytes=late,
        held_gradient_bytes=0.0 if stage == 3 else low_grads,
        backward_end_bytes=(0.0 if stage == 3 else low_grads) + buckets + with_activations,
        step_gradient_bytes=step_grads,
        step_temporary_bytes=step_scratch,
    )

"""LoRA on FSDP2 (`fully_shard`): the 16-bit (or fp32) base and the fp32 adapters sharded over N ranks,
only the adapters' gradients, the adapters' optimizer state over N.

Like a full fine-tune on FSDP2 (temporaries.py `_fsdp`): each block and the root are units; a unit is
all-gathered at the compute dtype (MixedPrecisionPolicy casts the fp32 adapters too) for its forward
and backward, FULL_SHARD (stage 3) re-shards after forward, SHARD_GRAD_OP (stage 2) keeps every unit
gathered until its backward, and one unit is prefetched ahead. What differs: only adapter gradients
exist (unsharded for the unit in backward, plus the fp32 `reduce_dtype` copy under bf16, then sharded
fp32), the step and the gloo reduce-scatter copy touch adapters only, and there are no autocast weight
copies (FSDP casts at gather). QLoRA (the FSDP+QLoRA recipe): the 4-bit weights are packed in the
compute dtype (`quant_storage`), sharded and gathered like any parameter at 0.5 B per weight; their
quantisation constants stay whole on every rank (they live on the layer, not in a parameter), and one
layer at a time is dequantised during its matmul.
"""

from __future__ import annotations

from memfit.api.common import Offload, PeftMethod
from memfit.api.job import OptimizerKind
from memfit.memory.adapter import AdapterLayout
from memfit.memory.shape import Shape
from memfit.memory.states import ModelStates
from memfit.memory.strategy import Device, Strategy
from memfit.memory.temporaries import CPU_BNB_TEMPORARIES, FSDP_LIVE_UNITS, PhaseBytes, adam_scratch

ADAPTER_BYTES = 4.0
NF4_BYTES = 0.5  # a packed 4-bit weight (peft.py)


def fsdp_peft_states(states: ModelStates, strategy: Strategy) -> ModelStates:
    """The DDP-layout PEFT states (peft.py) sharded over the N ranks."""
    n = strategy.world_size
    return ModelStates(states.parameters_bytes / n, states.gradients_bytes / n, states.optimizer_bytes / n)


def fsdp_peft_phases(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> PhaseBytes:
    """FSDP2 phases with only the adapters trainable (see the module docstring)."""
    n = strategy.world_size
    adapters = float(shape.layers * layout.adapter_parameters_per_block)
    param_bytes = 2.0 if strategy.mixed_precision else 4.0
    reduce_extra = 4.0 if strategy.mixed_precision else 0.0
    unit_adapters = float(layout.adapter_parameters_per_block)
    unit = float(max(shape.block_parameters + unit_adapters, shape.root_parameters))
    qlora = strategy.config.peft == PeftMethod.QLORA
    dequant = linear = 0.0
    if qlora:
        # The block's linear weights are gathered packed (0.5 B each: the storage dtype is the compute
        # dtype, so the mixed-precision cast leaves them alone), the rest at the compute dtype; one
        # layer's weight is dequantised at a time during its matmul (as on DDP).
        linear = float(layout.linear_weights_per_block)
        unit = max(shape.block_parameters + unit_adapters - linear * (1.0 - NF4_BYTES / param_bytes),
                   float(shape.root_parameters))
        dequant = param_bytes * layout.largest_linear_weights
    unsharded_grads = unit_adapters * (param_bytes + reduce_extra)
    live_units = FSDP_LIVE_UNITS * unit
    if qlora:  # 4-bit blocks are far smaller than the root: the root and one block live, not two roots
        block_unit = shape.block_parameters + unit_adapters - linear * (1.0 - NF4_BYTES / param_bytes)
        live_units = unit + (FSDP_LIVE_UNITS - 1) * block_unit
    if strategy.config.zero_stage == 3:
        with_activations = 0.0
        gathered_late = live_units * param_bytes
    else:
        with_activations = gathered_late = (shape.parameters + adapters) * param_bytes
    sharded_grads = ADAPTER_BYTES * adapters / n
    step_scratch = _step_scratch(strategy, layout, local_adapters=adapters / n)
    if strategy.device == Device.CPU and n > 1:
        step_scratch += ADAPTER_BYTES * unit_adapters  # gloo: one unit's unsharded fp32 gradient
    if qlora and strategy.config.zero_stage != 3:
        gathered_late = with_activations = (float(shape.parameters) + adapters) * param_bytes - (
            shape.layers * linear * (param_bytes - NF4_BYTES))
    in_backward = unsharded_grads + (gathered_late if strategy.config.zero_stage == 3 else 0.0) + dequant
    if strategy.device == Device.CPU and n > 1 and strategy.config.zero_stage == 3:
        # gloo: the all-gather output of the unit just gathered is freed when ProcessGroupGloo's worker
        # thread drops its last reference to the finished work, which on a busy host can come after the
        # main thread has allocated the next prefetch (and gloo's own copy of it): one unit more, seen
        # in 2 of 7 runs of the fp32 GPT case (docs/peft.md, "Run-to-run truth"). A peak that happens in
        # some runs is the peak to plan for.
        in_backward += unit * param_bytes
    late_share = (shape.layers - 1) / shape.layers
    return PhaseBytes(
        persistent_bytes=0.0,
        with_activations_bytes=with_activations,
        in_backward_gradient_bytes=0.0,
        in_backward_bytes=in_backward,
        late_gradient_bytes=sharded_grads * late_share,
        late_backward_bytes=live_units * param_bytes + unsharded_grads + dequant,
        held_gradient_bytes=sharded_grads,
        backward_end_bytes=sharded_grads + gathered_late + unsharded_grads,
        step_gradient_bytes=sharded_grads,
        step_temporary_bytes=step_scratch,
    )


def _step_scratch(strategy: Strategy, layout: AdapterLayout, *, local_adapters: float) -> float:
    if strategy.config.offload != Offload.NONE:
        return 0.0
    largest = layout.largest_adapter_tensor / strategy.world_size  # the local shard of the largest
    if strategy.config.optimizer8bit:
        if strategy.optimizer == OptimizerKind.SGD or strategy.device == Device.CUDA:
            return 0.0
        return CPU_BNB_TEMPORARIES * 4.0 * largest
    return adam_scratch(strategy, elements=local_adapters, largest=largest)

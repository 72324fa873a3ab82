"""Memory of LoRA and QLoRA training (DDP; FSDP2 in peft_fsdp.py, LoRA on DeepSpeed ZeRO-3 in peft_deepspeed.py): a frozen base in 16 or 4 bits, fp32 adapters with their
gradients and optimizer state, and the activations a frozen base saves.

Model states (per GPU; Ψ all parameters, A adapter parameters, Q the blocks' linear weights):
- LoRA base: Ψ at the training dtype (2 B under bf16/fp16 -- the base is cast, no fp32 master --
  4 B in fp32), frozen: no gradient, no optimizer state (Hu et al. 2021, §4.2).
- QLoRA base (Dettmers et al. 2023, §3; bitsandbytes `quantize_4bit`, blocksize 64): the blocks'
  linear weights at 0.5 B each plus one absmax per 64 weights, fp32 (4/64 B) or, with double
  quantisation, 8-bit with one fp32 second-level constant per 256 absmax (1/64 + 4/(64·256) B) and a
  256-entry fp32 code; every other parameter (embeddings, norms, biases, head) at the compute dtype.
- Adapters in fp32 (peft keeps them there under autocast): 4A weights, 4A gradients, the optimizer's
  state over A (8-bit for tensors of at least 4096 elements). DDP at world size 2+ keeps 4A buckets.

Activations per token (each saved tensor with its dtype), relative to a full fine-tune
(activations.py): the residual stream is at the base's dtype (no fp32 master under autocast); a
linear layer's input is saved only when a trainable weight reads it (an adapter's A), so inputs only
frozen layers read are not kept; every A output (rank wide) is saved by its B; adapter dropout saves
its output and a 1-byte mask per targeted layer; nothing before the first block needs a gradient,
so the first block's first norm saves nothing, and the frozen head saves no input. Under autocast
each fp32 adapter weight gets a cached 16-bit copy (2A, alive with the activations). In a block's
backward an adapted layer's input gradient exists twice before the sum (frozen path and adapter
path) while that input is freed: one input-sized tensor more, which matters where a block's backward
is the peak (ViT's first-token head). QLoRA
dequantises one layer's weight to the compute dtype at a time (a temporary during its matmul).
Checked against allocator peaks of real CPU steps (benchmarks/memory_accuracy.py --section peft).
"""

from __future__ import annotations

from memfit.api.common import Checkpointing, Engine, PeftMethod
from memfit.memory.activations import (
    DROPOUT_MASK_BYTES,
    LOGIT_GRAD_BYTES,
    LOGPROB_BYTES,
    ActivationTerms,
    _attention_core,
    _mlp,
    _norm,
)
from memfit.memory.adapter import AdapterLayout
from memfit.memory.peft_deepspeed import deepspeed_peft_phases, deepspeed_peft_states
from memfit.memory.peft_fsdp import fsdp_peft_phases, fsdp_peft_states
from memfit.memory.shape import Shape
from memfit.memory.states import ModelStates, optimizer_state_bytes_per_param
from memfit.memory.strategy import Device, Strategy
from memfit.memory.temporaries import CPU_BNB_TEMPORARIES, PhaseBytes, adam_scratch

# bitsandbytes 4-bit: two values per byte; absmax per 64-value block (QLoRA §3, `blocksize=64`).
NF4_BYTES = 0.5
NF4_BLOCK = 64
# Double quantisation: 8-bit absmax with an fp32 constant per 256 of them (QLoRA §3, "Double Quantization").
NF4_NESTED_BLOCK = 256
# Per quantised layer: the 16-entry fp32 4-bit code; with double quantisation also the 256-entry
# fp32 code of the 8-bit absmax (bitsandbytes QuantState.code / state2.code); measured 1,100 B/layer.
QUANT_CODE_BYTES = 16 * 4
NESTED_CODE_BYTES = 256 * 4
ADAPTER_BYTES = 4.0  # fp32 adapter weights and gradients


def adapter_parameters(shape: Shape, layout: AdapterLayout) -> int:
    """All adapter parameters of the model (the trainable ones)."""
    return shape.layers * layout.adapter_parameters_per_block


def base_bytes(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> float:
    """The frozen base: 16-bit (or fp32) LoRA, or QLoRA's 4-bit linear weights with their constants."""
    return base_tensor_bytes(shape, strategy, layout) + quantisation_state_bytes(shape, strategy, layout)


def base_tensor_bytes(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> float:
    """The frozen base's parameters (what FSDP shards): every weight at the compute dtype, or QLoRA's
    packed 4-bit linear weights (0.5 B each, in whatever storage dtype) and the rest at the compute dtype."""
    compute = 4.0 if not strategy.mixed_precision else 2.0
    if strategy.config.peft != PeftMethod.QLORA:
        return compute * shape.parameters
    quantised = float(shape.layers * layout.linear_weights_per_block)
    return NF4_BYTES * quantised + compute * (shape.parameters - quantised)


def quantisation_state_bytes(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> float:
    """QLoRA's quantisation constants and codes (0 for LoRA): kept on each layer, not parameters, so every
    rank holds them whole under FSDP."""
    if strategy.config.peft != PeftMethod.QLORA:
        return 0.0
    quantised = float(shape.layers * layout.linear_weights_per_block)
    blocks = quantised / NF4_BLOCK
    constants = blocks * (1.0 + 4.0 / NF4_NESTED_BLOCK) if layout.double_quant else blocks * 4.0
    per_layer = QUANT_CODE_BYTES + (NESTED_CODE_BYTES if layout.double_quant else 0)
    return constants + per_layer * shape.layers * layout.linears_per_block


def peft_states(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> ModelStates:
    """Base + adapters (parameters), adapter gradients, optimizer state over the adapters."""
    a = float(adapter_parameters(shape, layout))
    state = optimizer_state_bytes_per_param(strategy.optimizer, eight_bit=False)
    optimizer = state * a
    if strategy.config.optimizer8bit:
        small = float(shape.layers * layout.small_adapter_tensors_per_block)
        eight = optimizer_state_bytes_per_param(strategy.optimizer, eight_bit=True)
        optimizer = eight * (a - small) + state * small
    if strategy.config.engine == Engine.DEEPSPEED:
        return deepspeed_peft_states(shape, strategy, adapters=a, optimizer_bytes=optimizer)
    params = base_bytes(shape, strategy, layout) + ADAPTER_BYTES * a
    if strategy.config.engine == Engine.FSDP:
        tensors = base_tensor_bytes(shape, strategy, layout) + ADAPTER_BYTES * a
        sharded = fsdp_peft_states(ModelStates(tensors, ADAPTER_BYTES * a, optimizer), strategy)
        whole = quantisation_state_bytes(shape, strategy, layout) + shape.buffer_bytes
        return ModelStates(sharded.parameters_bytes + whole, sharded.gradients_bytes, sharded.optimizer_bytes)
    return ModelStates(params + shape.buffer_bytes, ADAPTER_BYTES * a, optimizer)


def peft_phases(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> PhaseBytes:
    """DDP phases with only the adapters trainable (temporaries.py `_ddp` with A for Ψ); FSDP2 in
    peft_fsdp.py."""
    if strategy.config.engine == Engine.FSDP:
        return fsdp_peft_phases(shape, strategy, layout)
    a = float(adapter_parameters(shape, layout))
    if strategy.config.engine == Engine.DEEPSPEED:
        return deepspeed_peft_phases(shape, strategy, layout, adapters=a)
    grads = ADAPTER_BYTES * a
    full = strategy.config.activation_checkpointing == Checkpointing.FULL
    copies = 2.0 * a / (shape.layers if full else 1) if strategy.mixed_precision else 0.0
    dequant = 0.0
    if strategy.config.peft == PeftMethod.QLORA:
        dequant = (2.0 if strategy.mixed_precision else 4.0) * layout.largest_linear_weights
    scratch = _step_scratch(strategy, layout, a)
    late_share = (shape.layers - 1) / shape.layers
    if strategy.world_size > 1:
        return PhaseBytes(
            persistent_bytes=grads, with_activations_bytes=copies, in_backward_gradient_bytes=0.0,
            in_backward_bytes=dequant, late_gradient_bytes=0.0, late_backward_bytes=dequant + copies / shape.layers,
            held_gradient_bytes=0.0, backward_end_bytes=0.0, step_gradient_bytes=0.0, step_temporary_bytes=scratch,
        )
    return PhaseBytes(
        persistent_bytes=0.0, with_activations_bytes=copies, in_backward_gradient_bytes=0.0,
        in_backward_bytes=dequant, late_gradient_bytes=grads * late_share,
        late_backward_bytes=dequant + copies / shape.layers, held_gradient_bytes=grads,
        backward_end_bytes=grads, step_gradient_bytes=grads, step_temporary_bytes=scratch,
    )


def _step_scratch(strategy: Strategy, layout: AdapterLayout, adapters: float) -> float:
    from memfit.api.job import OptimizerKind

    if strategy.config.optimizer8bit:
        if strategy.optimizer == OptimizerKind.SGD or strategy.device == Device.CUDA:
            return 0.0
        return CPU_BNB_TEMPORARIES * 4.0 * layout.largest_adapter_tensor
    return adam_scratch(strategy, elements=adapters, largest=layout.largest_adapter_tensor)


def peft_activation_terms(shape: Shape, strategy: Strategy, layout: AdapterLayout) -> ActivationTerms:
    """Per-sample activation bytes with a frozen base (see the module docstring)."""
    dtype = 2 if strategy.mixed_precision else 4  # compute and residual: the base runs at one dtype
    h, tokens, layers = shape.hidden, shape.tokens, shape.layers
    norm = _norm(shape, dtype)
    # The full fine-tune's block (one saved copy per shared input), less the inputs no adapter reads,
    # plus the A outputs and the adapters' dropout (its output and mask; the undropped input goes).
    cpu, autocast = strategy.device == Device.CPU, strategy.mixed_precision and strategy.config.engine == Engine.DDP
    attn = norm + _attention_core(shape, dtype, cpu=cpu, autocast=autocast)
    mlp = norm + _mlp(shape, dtype, cpu=cpu)
    adapter = dtype * (layout.adapter_output_width - layout.unsaved_input_width)
    # torch's CPU dropout keeps its mask at the input's dtype; CUDA's native_dropout a bool mask.
    mask = DROPOUT_MASK_BYTES if strategy.device == Device.CUDA else dtype
    if layout.dropout:
        adapter += (mask + dtype) * layout.dropout_input_width - dtype * layout.private_saved_input_width
    block = attn + mlp + adapter
    ckpt = strategy.config.activation_checkpointing
    if ckpt == Checkpointing.FULL:
        per_layer, recompute = float(dtype * h), block
    elif ckpt == Checkpointing.SELECTIVE:
        recompute = _attention_core(shape, dtype, cpu=cpu, autocast=autocast)
        per_layer = block - recompute + dtype * h
    else:
        per_layer, recompute = block, 0.0
    # Nothing before the first block needs a gradient: its first norm saves nothing (full
    # checkpointing keeps the block input all the same). Outside the blocks: the final norm only.
    first = 0.0 if ckpt == Checkpointing.FULL else norm
    if layout.dropout and ckpt != Checkpointing.FULL:
        first += mask * layout.first_input_targeted_width  # its input needs no gradient: no mask
    outside = (DROPOUT_MASK_BYTES * h if shape.dropout else 0) + norm
    stored = layers * per_layer - first + outside
    head_kept = LOGPROB_BYTES * shape.vocab
    head_backward = LOGIT_GRAD_BYTES * shape.vocab if shape.vocab else dtype * h
    # A block's backward: the flowing gradients plus, where an adapted layer's input gradient is
    # built from the frozen path and the adapter path, one more tensor as wide as the widest adapted
    # layer (its input, or under full checkpointing -- the recomputed block's outputs are freed as
    # backward goes -- its output): read off allocator timelines of ViT steps, whose peak is there.
    extra_gradient = layout.widest_targeted_output if ckpt == Checkpointing.FULL else layout.widest_targeted_input
    return ActivationTerms(
        activation_bytes_per_sample=(stored + head_kept) * tokens,
        temporary_bytes_per_sample=float(head_backward * tokens),
        block_activation_bytes_per_sample=(stored + recompute) * tokens,
        block_temporary_bytes_per_sample=float(dtype * (shape.ffn + h + extra_gradient) * tokens),
        last_block_activation_bytes_per_sample=(per_layer + outside + recompute) * tokens,
    )

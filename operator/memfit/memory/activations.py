"""Activation memory per sample, after Korthikanti et al. 2023 ("Reducing Activation Recomputation in
Large Transformer Models", MLSys, arXiv 2205.05198, §4), generalised to the models memfit trains.

Korthikanti's per-layer count for 16-bit activations is sbh(34 + 5as/h) bytes: attention 11sbh
(QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1) + 5as²b (scores, softmax, dropout),
MLP 19sbh (input 2, fc1 output 8, GELU output 8, dropout mask 1), two LayerNorm inputs 4sbh. Here
each saved tensor is counted with its real dtype and size per token:

- `compute` bytes (2 under bf16/fp16, 4 in fp32) for matmul inputs and outputs;
- `residual` bytes for the residual stream and norm inputs: fp32 under torch.autocast (DDP keeps
  fp32 weights, so the stream stays fp32), 16-bit when the model itself runs in bf16/fp16 (FSDP2
  MixedPrecisionPolicy, DeepSpeed);
- SDPA / FlashAttention saves Q, K, V and the output, never the a·s scores (the 5as/h term vanishes);
  with grouped-query attention K and V are saved at their own (smaller) width (SDPA `enable_gqa`,
  Hugging Face transformers >= 4.5x; checked against saved-tensor hooks on LlamaForCausalLM);
- under torch.autocast every separate projection (Q, K, V; gate, up) casts and saves its own 16-bit
  copy of its input; one fused QKV matmul saves one;
- a SwiGLU MLP saves its input, gate output, SiLU output, up output and their product (h + 4f);
- Hugging Face RMSNorm upcasts to fp32 and saves the fp32 input as well (LlamaRMSNorm);
- dropout masks are 1 byte per element (CUDA's bool mask; a CPU's unfused dropout keeps a mask of the
  input's dtype), only when the model trains with dropout;
- the LM head saves the fp32 log-softmax of the logits (4 B x vocab per token, the loss upcasts
  logits with `.float()`); its backward briefly holds two more fp32 logit-sized gradients
  (8 B x vocab per token, reported as temporaries).

- bf16-pure: the model itself is bf16, so every saved tensor is 16-bit, the residual stream too
  (no autocast copies);
- chunked loss: the head's log-probabilities are never saved; backward recomputes one chunk of
  1/LOSS_CHUNKS of the tokens at a time (its 16-bit logits, fp32 log-probabilities and their two fp32
  gradients) and the head input's gradient (compute bytes x h) builds up over the chunks.

- activation offload (memfit_trainer.activation_offload, torchtune's `enable_activation_offloading`): every
  tensor a transformer block saves for backward leaves the device when it is saved (host memory) and comes
  back when backward needs it, except parameters and 16-bit copies of them (autocast's) and tensors under
  OFFLOAD_MIN_BYTES. What stays per block is what checkpointing keeps outside the saved-tensor hooks:
  `selective-op`'s matmul outputs (torch's selective checkpointing caches them itself); under `full` and
  `selective` the saved block (or attention) inputs go too. In backward a recomputed block's input is back
  next to its recomputed working set; a block that is not recomputed brings back what each node saved, as the
  node runs: at most one sub-block's saved tensors (attention's or the MLP's, the larger) are back at once. The head, the final norm and the loss are outside the blocks and stay.

- a classifier on the first token (ViT) materialises the gradient of the whole final hidden state
  in backward (`select_backward` allocates zeros of b x s x h), alive at the start of backward.

Checkpointing: `full` keeps each block's input (Korthikanti's 2sbh) plus one block's working set
while it is recomputed, and while that block runs backward the gradients flowing through it (the MLP's
inner gradient and the residual-stream gradient, (f + h) per token in the compute dtype) are alive
with it; `selective` recomputes the attention sub-block (memfit_trainer checkpoints the block's
attention module), keeping its input, the norms and the MLP; `selective-op` recomputes every block but keeps
its matmul and attention outputs (`matmul_outputs`: torch's selective activation checkpointing, the
per-op policy of torchtitan and Megatron's saved-GEMM schemes). The recomputed working set and the loss's
logit buffers are alive at different moments of backward: both are candidates (`ActivationTerms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.common import Checkpointing, Engine
from memfit.memory.shape import Shape
from memfit.memory.strategy import Device, Strategy

# Bytes of a dropout mask element (torch native_dropout saves a bool mask).
DROPOUT_MASK_BYTES = 1
# fp32 log-softmax saved by cross-entropy, per vocabulary entry and token (Korthikanti's 4sbV).
LOGPROB_BYTES = 4
# Backward of log-softmax: fp32 gradient in and out, per vocabulary entry and token.
LOGIT_GRAD_BYTES = 8
# LlamaRMSNorm saves its input upcast to fp32.
RMSNORM_FP32_COPY_BYTES = 4
# Chunked loss: chunks of the flattened tokens (torchtune's CEWithChunkedOutputLoss uses 8).
LOSS_CHUNKS = 8
# Activation offload: saved tensors smaller than this stay on the device (torchtune's `min_offload_size`).
OFFLOAD_MIN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ActivationTerms:
    """Per-sample bytes at the two candidate activation peaks of backward.

    At the loss: every saved activation, the head's saved log-probabilities and the loss's gradient
    buffers (`activation_bytes_per_sample`, `temporary_bytes_per_sample`); no gradient exists yet.
    In the first block's backward: the saved activations, the recomputed block's working set under
    checkpointing and the gradients flowing through the block (`block_*`); by then the engine has
    produced the head's gradients and gathered the block (temporaries.py `in_backward_bytes`).
    In the last block's backward (`last_block_*`, same temporaries): only that block's saved
    activations are left, but nearly every gradient exists (`late_backward_bytes`). Backward frees
    activations and adds gradients linearly block by block, so these two ends bound every block.
    """

    activation_bytes_per_sample: float
    temporary_bytes_per_sample: float
    block_activation_bytes_per_sample: float = 0.0
    block_temporary_bytes_per_sample: float = 0.0
    last_block_activation_bytes_per_sample: float = 0.0
    offloaded_bytes_per_sample: float = 0.0  # activation offload: saved in host memory at the loss


def dtype_bytes(strategy: Strategy) -> tuple[int, int]:
    """(compute bytes, residual-stream bytes) of the strategy's precision regime."""
    if strategy.pure_bf16:
        return 2, 2  # the model itself is bf16: no autocast, no fp32 stream
    if not strategy.mixed_precision:
        return 4, 4
    # torch.autocast (DDP) keeps fp32 weights, so adds and norms stay fp32.
    return 2, (4 if strategy.config.engine == Engine.DDP else 2)


def _norm(shape: Shape, residual: int) -> int:
    h = shape.hidden
    return (RMSNORM_FP32_COPY_BYTES * h + residual * h) if shape.rms_norm else residual * h


def _input_copies(shape: Shape, strategy: Strategy, *, projections: int) -> int:
    """Saved copies of a sub-block's input: one per projection under autocast, else one shared."""
    autocast = strategy.mixed_precision and strategy.config.engine == Engine.DDP
    return projections if autocast and shape.separate_qkv else 1


def scores_bytes(shape: Shape, compute: int, *, cpu: bool, autocast: bool) -> float:
    """Bytes per token of attention-score-sized tensors saved for backward, in units of a·s (heads x
    sequence); measured with saved-tensor hooks on transformers' Llama, GPT-2 and BERT (CPU) and read from
    PyTorch's autocast and SDPA kernel rules (CUDA):

    - SDPA / FlashAttention: none; except with attention dropout on a CPU, where SDPA falls back to its
      math path in fp32 (softmax, dropout mask and output: 12 B);
    - eager: the softmax output, fp32 when the model upcasts it (transformers' decoders:
      `softmax(dtype=float32)`) or when CUDA autocast runs softmax in fp32 (not CPU autocast, not a model
      whose weights are 16-bit: DeepSpeed, FSDP's mixed precision), else in the compute dtype (Korthikanti's
      2as); the compute-dtype copy the second matmul saves when they differ. With dropout on CUDA (fused
      `native_dropout`) a 1-byte mask and the dropout output take the copy's place; on a CPU the unfused
      dropout keeps a mask and an output in the softmax's dtype (3 x the softmax bytes)."""
    a_s = shape.heads * shape.tokens
    if shape.flash_attention:
        return 12.0 * a_s if shape.dropout and cpu else 0.0
    upcast = shape.family == "decoder" or (autocast and not cpu and compute < 4)
    softmax = 4 if upcast else compute
    if not shape.dropout:
        return float((softmax + (compute if softmax != compute else 0)) * a_s)
    if cpu:
        return float(3 * softmax * a_s)
    return float((softmax + DROPOUT_MASK_BYTES + compute) * a_s)


def _attention_core(shape: Shape, compute: int, copies: int = 1, *, cpu: bool = False,
                    autocast: bool = False) -> float:
    """Bytes per token of the attention sub-block after its norm: QKV input, Q/K/V, output, masks, and
    the scores where they are materialised (`scores_bytes`). Eager attention also saves K and V repeated
    to every query head (transformers' `repeat_kv`), where SDPA keeps them at their grouped width."""
    h = shape.hidden
    kv = shape.kv_hidden if shape.flash_attention else h
    core = compute * h * copies + compute * (h + 2 * kv) + compute * h
    if shape.dropout:
        core += mask_bytes(compute, cpu=cpu) * h
    return core + scores_bytes(shape, compute, cpu=cpu, autocast=autocast)


def matmul_outputs(shape: Shape, compute: int) -> float:
    """Bytes per token one block keeps under `selective-op` (memfit_trainer.strategies.checkpointing: torch's
    selective activation checkpointing saving the outputs of mm/addmm/bmm and the SDPA kernels): the Q, K and
    V projections, the attention output and its fp32 log-sum-exp (4 B per head), the output projection, the
    MLP's up (and gate) and down projections, in the compute dtype. Eager attention's two batched products
    keep the scores as well. Checked with the CPU allocator meter on builtin GPT and BERT: exact."""
    h, f = shape.hidden, shape.ffn
    projections = (h + 2 * shape.kv_hidden) + h + h + (2 * f if shape.gated_mlp else f) + h
    kept = compute * projections
    if shape.flash_attention:
        return kept + 4.0 * shape.heads
    return kept + compute * shape.heads * shape.tokens


def mask_bytes(dtype: int, *, cpu: bool) -> int:
    """A dropout mask's bytes per element: CUDA's fused native_dropout keeps a bool mask; a CPU's unfused
    dropout multiplies by a mask of the input's dtype (`dtype` bytes) and keeps that."""
    return dtype if cpu else DROPOUT_MASK_BYTES


def _mlp(shape: Shape, compute: int, copies: int = 1, *, cpu: bool = False) -> float:
    h, f = shape.hidden, shape.ffn
    mlp = compute * (h * copies + 4 * f) if shape.gated_mlp else compute * (h * copies + 2 * f)
    if shape.dropout:
        mlp += mask_bytes(compute, cpu=cpu) * h
    return mlp


def activation_terms(shape: Shape, strategy: Strategy) -> ActivationTerms:
    """Activation and backward-temporary bytes per sample for the strategy's precision and
    checkpointing (no sharding of activations: data parallelism only)."""
    compute, residual = dtype_bytes(strategy)
    h, tokens, layers = shape.hidden, shape.tokens, shape.layers
    norm = _norm(shape, residual)
    qkv_copies = _input_copies(shape, strategy, projections=3)
    mlp_copies = _input_copies(shape, strategy, projections=2 if shape.gated_mlp else 1)
    cpu, autocast = strategy.device == Device.CPU, strategy.mixed_precision and strategy.config.engine == Engine.DDP
    attn = norm + _attention_core(shape, compute, qkv_copies, cpu=cpu, autocast=autocast)
    mlp = norm + _mlp(shape, compute, mlp_copies, cpu=cpu)
    if strategy.config.activation_checkpointing == Checkpointing.FULL:
        per_layer, recompute = float(residual * h), attn + mlp
    elif strategy.config.activation_checkpointing == Checkpointing.SELECTIVE:
        per_layer = norm + residual * h + mlp
        recompute = _attention_core(shape, compute, qkv_copies, cpu=cpu, autocast=autocast)
    elif strategy.config.activation_checkpointing == Checkpointing.SELECTIVE_OP:
        kept = matmul_outputs(shape, compute)
        # The recomputed block reads its kept outputs from the cache: the rest of its working set is new.
        per_layer, recompute = residual * h + kept, max(0.0, attn + mlp - kept)
    else:
        per_layer, recompute = attn + mlp, 0.0
    offloaded = back = 0.0
    if strategy.config.activation_offload:
        # selective-op's kept matmul outputs live in its own cache, outside the saved-tensor hooks.
        offloaded = residual * h if strategy.config.activation_checkpointing == Checkpointing.SELECTIVE_OP else per_layer
        # Back on the device in a block's backward: a recomputed block's saved input; else each node brings back
        # only what it saved, so at most one sub-block's tensors (attention's or the MLP's) are back at once.
        back = offloaded if strategy.config.activation_checkpointing in (
            Checkpointing.FULL, Checkpointing.SELECTIVE_OP) else min(offloaded, max(attn, mlp))
    # Outside the blocks: embedding dropout, final norm and head input.
    outside = (mask_bytes(residual, cpu=cpu) * h if shape.dropout else 0) + norm + compute * h
    stored = layers * (per_layer - offloaded) + outside
    head_kept = LOGPROB_BYTES * shape.vocab
    # LM head: two fp32 logit-sized gradients; first-token classifier: the hidden state's gradient.
    head_backward: float = LOGIT_GRAD_BYTES * shape.vocab if shape.vocab else residual * h
    if strategy.config.chunked_loss and shape.vocab:
        # Chunked loss (memfit_trainer.chunked_loss): only the head's input is saved; in backward one
        # chunk's logits are recomputed (16-bit and the fp32 log-probabilities) next to their two fp32
        # gradients, while the head input's gradient fills in chunk by chunk.
        head_kept = 0
        head_backward = (compute + LOGPROB_BYTES + LOGIT_GRAD_BYTES) * shape.vocab / LOSS_CHUNKS + compute * h
    # A block's backward: the MLP's inner gradient and the residual-stream gradient.
    block_gradients = compute * (shape.ffn + h)
    return ActivationTerms(
        activation_bytes_per_sample=(stored + head_kept) * tokens,
        temporary_bytes_per_sample=float(head_backward * tokens),
        block_activation_bytes_per_sample=(stored + back + recompute) * tokens,
        block_temporary_bytes_per_sample=float(block_gradients * tokens),
        last_block_activation_bytes_per_sample=(per_layer - offloaded + back + outside + recompute) * tokens,
        offloaded_bytes_per_sample=layers * offloaded * tokens,
    )

"""What one micro-step of a model computes and moves, per token, for the roofline (timing.roofline):
the GEMMs of a block and the head, attention, element-wise and loss traffic, kernel launches.

Counted from the Hugging Face blocks memfit's trainer runs, in eager PyTorch:
- Gated blocks (Llama, Mistral, Qwen2): q, k, v, o projections (separate GEMMs), gate and up, down;
  two RMSNorms computed in fp32 (upcast, square, mean, rsqrt, two multiplies, downcast: about 20
  bytes per element forward each in 16-bit training), rotary on q and k (about six kernels reading
  and writing them), SiLU(gate) x up, two residual adds.
- GPT/BERT/ViT blocks: fused or separate q, k, v, o, the two MLP matrices; two LayerNorms (fp32
  output under autocast, cast back by the next linear), one GELU, two residual adds, and dropout on
  the attention and MLP outputs when the model trains with dropout (a mask byte per element).
- Encoders attend in both directions; decoders are causal (flash kernels skip the masked half).
- LoRA/QLoRA: a frozen base weight has no weight gradient; every targeted layer adds the adapter's
  dropout on its input and the add of its output, and five small kernels forward.
"""

from __future__ import annotations

from functools import lru_cache

from memfit.api.common import Checkpointing, PeftMethod, Precision
from memfit.memory.adapter import AdapterLayout
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy
from memfit.timing.roofline import KERNELS_PER_BLOCK_FORWARD, LOSS_BYTES_PER_VOCAB, BlockWork, Gemm

# Forward bytes per element of one RMSNorm in fp32 (see above) and of one LayerNorm under autocast.
RMS_NORM_BYTES_PER_ELEMENT = 20.0
LAYER_NORM_BYTES_PER_ELEMENT = 6.0
# Kernels of one LoRA adapter forward: dropout, A, B, scale, add.
ADAPTER_KERNELS = 5
# Kernels of the loss and head per micro-step.
HEAD_KERNELS = 20


def _block_gemms(shape: Shape) -> list[tuple[int, int]]:
    """(in, out) of each linear layer of one block."""
    h, kv, f = shape.hidden, shape.kv_hidden, shape.ffn
    attention = [(h, h), (h, kv), (h, kv)] if shape.separate_qkv or shape.gated_mlp else [(h, h + 2 * kv)]
    attention.append((h, h))
    mlp = [(h, f), (h, f), (f, h)] if shape.gated_mlp else [(h, f), (f, h)]
    return attention + mlp


def _elementwise_forward_bytes(shape: Shape, eb: int) -> float:
    """Bytes per token of one block's element-wise ops, forward."""
    h, kv, f = shape.hidden, shape.kv_hidden, shape.ffn
    residual = 2 * 3 * h * eb
    if shape.gated_mlp:
        norms = 2 * h * (RMS_NORM_BYTES_PER_ELEMENT if eb == 2 else 5 * eb)
        rotary = 12 * (h + kv) * eb
        activation = 5 * f * eb
        return norms + rotary + activation + residual
    norms = 2 * h * (LAYER_NORM_BYTES_PER_ELEMENT * 2 if eb == 2 else 2 * eb)
    activation = 2 * f * eb
    dropout = 2 * (2 * eb + 1) * h if shape.dropout else 0.0
    return norms + activation + residual + dropout


def block_work(shape: Shape, strategy: Strategy) -> BlockWork:
    """The micro-step work of `strategy` on `shape` (per token; the roofline multiplies by tokens). The
    same for every engine, stage and layout: computed once per precision, checkpointing and adapter."""
    config = strategy.config
    frozen = config.peft != PeftMethod.NONE
    return _block_work(shape, config.precision, config.activation_checkpointing, frozen,
                       strategy.adapter if frozen else None, config.chunked_loss)


@lru_cache(maxsize=1024)
def _block_work(shape: Shape, precision: Precision, checkpointing: Checkpointing, frozen: bool,
                adapter: AdapterLayout | None, chunked_loss: bool = False) -> BlockWork:
    eb = 2 if precision in (Precision.BF16, Precision.FP16, Precision.BF16_PURE) else 4
    full = checkpointing == Checkpointing.FULL
    selective = checkpointing == Checkpointing.SELECTIVE
    backward = 1.0 if frozen else 2.0
    linears = _block_gemms(shape)
    attention_linears = 4 if (shape.separate_qkv or shape.gated_mlp) else 2
    gemms = tuple(
        Gemm(k, n, 1.0 + (1.0 if full or (selective and i < attention_linears) else 0.0), backward)
        for i, (k, n) in enumerate(linears)
    )
    # A chunked loss runs the head's forward twice (again in backward, chunk by chunk).
    head = Gemm(shape.hidden, shape.vocab, 2.0 if chunked_loss else 1.0, backward) if shape.vocab > 0 else None
    s, h = shape.tokens, shape.hidden
    causal = shape.family == "decoder"
    recompute = 1.0 if full or selective else 0.0
    # Fused kernels (SDPA: FlashAttention-2, or the memory-efficient kernel where flash cannot run) skip a
    # causal model's masked half and recompute the scores backward (2.5x forward); eager attention runs
    # the whole s x s product, backward 2x forward, and moves the scores through HBM: written, softmax
    # read and written, read by the values product, and twice that backward.
    fused_flops = shape.layers * 4.0 * s * h * (0.5 if causal else 1.0) * (1.0 + 2.5 + recompute)
    eager_flops = shape.layers * 4.0 * s * h * (1.0 + 2.0 + recompute)
    eager_bytes = shape.layers * shape.heads * s * eb * 12.0
    forward = _elementwise_forward_bytes(shape, eb)
    # selective-op re-runs the element-wise ops (norms, activations, residual adds) of every block, no GEMM.
    rerun = 1.0 if full or checkpointing == Checkpointing.SELECTIVE_OP else 0.0
    elementwise = shape.layers * forward * (3.0 + rerun)
    kernels_forward = KERNELS_PER_BLOCK_FORWARD[shape.gated_mlp]
    kernels = shape.layers * kernels_forward * (3.0 + rerun) + HEAD_KERNELS
    if adapter is not None:
        targeted = adapter.targeted
        elementwise += shape.layers * 3.0 * sum((2 * k + 3 * n) * eb for k, n in targeted)
        kernels += shape.layers * len(targeted) * ADAPTER_KERNELS * 3.0
    # (a chunked loss runs its forward a second time in backward: a third more of its traffic)
    elementwise += LOSS_BYTES_PER_VOCAB * shape.vocab * (2.0 if eb == 4 else 1.0) * (4 / 3 if chunked_loss else 1.0)
    return BlockWork(
        gemms=gemms,
        layers=shape.layers,
        head=head,
        fused_attention=shape.flash_attention,
        attention_flops_per_token=fused_flops if shape.flash_attention else eager_flops,
        attention_bytes_per_token=0.0 if shape.flash_attention else eager_bytes,
        elementwise_bytes_per_token=elementwise,
        element_bytes=eb,
        kernels=kernels,
    )


def counted_flops_per_sample(shape: Shape) -> float:
    """Training FLOPs per sample as a FLOP counter sees them (torch.utils.flop_counter, the profile's
    `flops_per_sample`): every GEMM forward and backward (3 x 2 k n per token: the blocks' linear layers
    and the head, never the input embedding, a lookup), attention's two products over the whole sequence
    (12 s h per token and layer), no recomputation. A profile's measured FLOPs scale the roofline's
    arithmetic by their ratio to this."""
    per_block = sum(2.0 * k * n for k, n in _block_gemms(shape))
    head = 2.0 * shape.hidden * shape.vocab
    s = shape.tokens
    return s * (3.0 * (shape.layers * per_block + head) + 12.0 * shape.layers * s * shape.hidden)


def arithmetic_flops_per_token(work: BlockWork) -> float:
    """The FLOPs the roofline runs per token of a micro-step (recompute and causal skip included): the
    compute can never take less than this over the GPU's peak."""
    gemm = sum(2.0 * g.k * g.n * (g.forward_passes + g.backward_passes) for g in work.gemms) * work.layers
    if work.head is not None:
        gemm += 2.0 * work.head.k * work.head.n * (work.head.forward_passes + work.head.backward_passes)
    return gemm + work.attention_flops_per_token

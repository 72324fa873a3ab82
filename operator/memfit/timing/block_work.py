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

from memfit.api.common import Checkpointing, PeftMethod, Precision
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
    """The micro-step work of `strategy` on `shape` (per token; the roofline multiplies by tokens)."""
    config = strategy.config
    eb = 2 if config.precision in (Precision.BF16, Precision.FP16) else 4
    checkpointing = config.activation_checkpointing
    frozen = config.peft != PeftMethod.NONE
    adapter = strategy.adapter if frozen else None
    full = checkpointing == Checkpointing.FULL
    selective = checkpointing == Checkpointing.SELECTIVE
    backward = 1.0 if frozen else 2.0
    linears = _block_gemms(shape)
    attention_linears = 4 if (shape.separate_qkv or shape.gated_mlp) else 2
    gemms = tuple(
        Gemm(k, n, 1.0 + (1.0 if full or (selective and i < attention_linears) else 0.0), backward)
        for i, (k, n) in enumerate(linears)
    )
    head = Gemm(shape.hidden, shape.vocab, 1.0, backward) if shape.vocab > 0 else None
    s, h = shape.tokens, shape.hidden
    causal = shape.family == "decoder"
    attention_forward = 4.0 * s * h * (0.5 if causal and shape.flash_attention else 1.0)
    passes = 1.0 + (2.5 if shape.flash_attention else 2.0) + (1.0 if full or selective else 0.0)
    attention_flops = shape.layers * attention_forward * passes
    # Without flash kernels the s x s scores go through HBM: written, softmax read and written, read by
    # the values product, and twice that backward.
    attention_bytes = 0.0 if shape.flash_attention else shape.layers * shape.heads * s * eb * 12.0
    forward = _elementwise_forward_bytes(shape, eb)
    elementwise = shape.layers * forward * (3.0 + (1.0 if full else 0.0))
    kernels_forward = KERNELS_PER_BLOCK_FORWARD[shape.gated_mlp]
    kernels = shape.layers * kernels_forward * (3.0 + (1.0 if full else 0.0)) + HEAD_KERNELS
    if adapter is not None:
        targeted = adapter.targeted
        elementwise += shape.layers * 3.0 * sum((2 * k + 3 * n) * eb for k, n in targeted)
        kernels += shape.layers * len(targeted) * ADAPTER_KERNELS * 3.0
    elementwise += LOSS_BYTES_PER_VOCAB * shape.vocab * (2.0 if eb == 4 else 1.0)
    return BlockWork(
        gemms=gemms,
        layers=shape.layers,
        head=head,
        attention_flops_per_token=attention_flops,
        attention_bytes_per_token=attention_bytes,
        elementwise_bytes_per_token=elementwise,
        element_bytes=eb,
        kernels=kernels,
    )


def analytic_flops_per_token(work: BlockWork) -> float:
    """The GEMM and attention FLOPs per token the roofline runs once each (no recompute): what a
    profile's measured FLOPs are compared with."""
    gemm = sum(2.0 * g.k * g.n * (1.0 + g.backward_passes) for g in work.gemms) * work.layers
    if work.head is not None:
        gemm += 2.0 * work.head.k * work.head.n * (1.0 + work.head.backward_passes)
    return gemm + work.attention_flops_per_token

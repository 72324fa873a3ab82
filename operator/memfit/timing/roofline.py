"""Roofline compute time of one micro-step on one GPU, per op class.

Each op class runs at the slower of its arithmetic and its memory traffic (the roofline model,
Williams, Waterman & Patterson, CACM 2009), against the GPU's datasheet rates scaled by what kernels
measurably reach. No constant here is fitted to a training throughput; each is a microbenchmark or a
count, with its source:

- GEMMs (every linear layer: forward, input gradient, weight gradient; a frozen weight has no weight
  gradient; recomputation repeats the forward). Arithmetic at `GpuRates.matmul_efficiency` of the
  dense peak (the Maximum Achievable Matmul FLOPS of large bf16 GEMMs: A100 SXM 85.9 %, H100 SXM
  80.1 %, B200 77.6 %; ml-engineering, compute/accelerator/README.md, "MAMF comparison table"), at
  the clock a GPU sustains at its power limit: SUSTAINED_FRACTION of that burst rate (the same
  benchmark's Maximum Sustainable Matmul FLOPS over its MAMF: H200 702.9 / 828.0, B200 1455.7 /
  1732.6, both 0.85; compute/accelerator/benchmarks/README.md, "alone vs all-8 concurrent"), times
  the wave efficiency of the GEMM's output tiles: a GEMM of T tiles on S SMs leaves on average
  half a wave idle, W / (W + 1/2) for W = T / S (NVIDIA, "Matrix Multiplication Background User's
  Guide", tile and wave quantization; 128x128 tiles). Memory: inputs, weights and output once.
- Attention scores and values (4 s h FLOPs per token and layer forward; backward 2.5x forward for
  FlashAttention-2's five matmuls against two, Dao 2023 §3.2). Flash kernels skip the masked half
  of a causal model and reach `GpuRates.attention_efficiency` of the peak: FlashAttention-2 (what
  PyTorch's SDPA runs) 50 % on Ampere and Ada (50-73 % forward, lower backward on A100, §4.1) and
  35 % on Hopper ("FlashAttention-2 achieves only 35 % utilization on H100", Shah et al. 2024,
  FlashAttention-3, abstract; assumed the same on Blackwell, where it does not use the new tensor
  cores either); where it cannot run (Volta, Turing, fp32) SDPA's memory-efficient kernel, at half that.
  A model with eager attention runs the whole s x s product at GEMM efficiency and moves the scores
  through HBM.
- Element-wise ops (norms, residual adds, activation functions, rotary, dropout, casts), memory
  bound: the bytes below per token and layer, forward; backward moves about twice that (it reads
  the saved inputs and the incoming gradient and writes the outgoing one). Counted from the eager
  PyTorch kernels of the Hugging Face blocks (an RMSNorm in fp32 is seven kernels), cross-checked
  against the saved-activation bytes of Korthikanti et al. 2022, Table 2 (34 s b h per layer).
- The loss: logits in 16 bits, upcast to fp32, log-softmax forward and backward: LOSS_BYTES_PER_VOCAB
  bytes per token and vocabulary entry.
- Kernel launches: the GPU idles when eager PyTorch dispatches kernels slower than they run
  (Horace He, "Making Deep Learning Go Brrrr From First Principles", the overhead-bound regime):
  a micro-step takes at least its kernel count x LAUNCH_SECONDS.

HBM traffic runs at HBM_EFFICIENCY of the datasheet bandwidth (BabelStream copy/triad reach 80-90 %
on A100 and H100: Deakin et al., "Performance portability across diverse computer architectures",
and the BabelStream results pages).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# Sustained (power-saturated) over burst matmul throughput (MSMF / MAMF, see above).
SUSTAINED_FRACTION = 0.85
# Fraction of datasheet HBM bandwidth streaming kernels reach (BabelStream, see above).
HBM_EFFICIENCY = 0.8
# Fraction of the dense peak FlashAttention-2 reaches forward + backward (see above), by architecture.
FLASH_EFFICIENCY = {"ampere": 0.5, "ada": 0.5, "hopper": 0.35, "blackwell": 0.35}
# Where FlashAttention-2 cannot run (Volta, Turing, fp32), PyTorch's SDPA takes its memory-efficient
# kernel (xFormers' CUTLASS kernel), which FlashAttention-2 outruns about twofold (Dao 2023, §4.1).
MEMORY_EFFICIENT_SHARE = 0.5
# Output tile of the tensor-core GEMM kernels by architecture (see above), in elements.
TILE_ELEMENTS = {"volta": 128 * 128, "turing": 128 * 128, "ampere": 128 * 128, "ada": 128 * 128,
                 "hopper": 128 * 256, "blackwell": 256 * 256}
# Seconds to dispatch one kernel from eager PyTorch (a few microseconds of Python and dispatcher
# overhead per op; He, "Making Deep Learning Go Brrrr").
LAUNCH_SECONDS = 6e-6
# Kernels per transformer block forward (eager Hugging Face blocks: norms, projections, rotary,
# attention, activation, residuals); backward launches about twice as many.
KERNELS_PER_BLOCK_FORWARD = {True: 36, False: 24}  # gated (Llama-style) : GPT/BERT-style
# Bytes per token and vocabulary entry of the loss: 16-bit logits written and read, the fp32 upcast
# written, log-softmax forward read/write, its backward read/write and the 16-bit gradient.
LOSS_BYTES_PER_VOCAB = 30.0


@dataclass(frozen=True, slots=True)
class GpuRates:
    """What the roofline needs of one GPU at one precision."""

    peak_flops: float  # dense FLOP/s at the precision
    hbm_bytes_per_s: float
    sm_count: int
    matmul_efficiency: float  # MAMF / datasheet peak
    flash_attention: bool  # FlashAttention kernels exist for this GPU and precision
    attention_efficiency: float = 0.5  # of the peak, flash kernels forward + backward
    tile_elements: int = 128 * 128  # output elements per GEMM tile


@dataclass(frozen=True, slots=True)
class Gemm:
    """One linear layer of a block: k inputs -> n outputs, and how many passes it runs per micro-step
    (forward 1 + input gradient 1 + weight gradient 1 for a trained weight, +1 when recomputed)."""

    k: int
    n: int
    forward_passes: float
    backward_passes: float


@dataclass(frozen=True, slots=True)
class BlockWork:
    """One micro-step's work that does not depend on the GPU: the GEMMs of one block (x `layers`) and
    of the head, attention, element-wise and loss traffic per token, and kernel launches."""

    gemms: tuple[Gemm, ...]
    layers: int
    head: Gemm | None
    fused_attention: bool  # the model runs SDPA (fused kernels), not eager attention
    attention_flops_per_token: float  # all layers, as executed (causal skip, recompute included)
    attention_bytes_per_token: float  # all layers: eager attention's scores through HBM
    elementwise_bytes_per_token: float  # all layers and the loss
    element_bytes: int  # 2 for bf16/fp16, 4 for fp32
    kernels: float  # per micro-step


def wave_efficiency(rows: int, cols: int, sm_count: int, tile_elements: int = 128 * 128) -> float:
    """Mean busy fraction of the SMs over a GEMM with a rows x cols output (half a wave idle on average;
    non-decreasing in rows, so a larger micro-batch is never slower per token)."""
    waves = rows * cols / tile_elements / max(1, sm_count)
    return waves / (waves + 0.5)


def gemm_seconds(m: int, gemm: Gemm, rates: GpuRates, element_bytes: int) -> float:
    """One micro-step of `gemm` on m tokens: each pass at the slower of arithmetic and traffic."""
    flops = 2.0 * m * gemm.k * gemm.n
    traffic = element_bytes * (m * gemm.k + gemm.k * gemm.n + m * gemm.n) / (rates.hbm_bytes_per_s * HBM_EFFICIENCY)
    sustained = rates.peak_flops * rates.matmul_efficiency * SUSTAINED_FRACTION
    forward_rate = sustained * wave_efficiency(m, gemm.n, rates.sm_count, rates.tile_elements)
    # Backward: the input gradient has an m x k output; the weight gradient reduces over m (split-K).
    backward_rate = sustained * wave_efficiency(m, max(gemm.k, gemm.n), rates.sm_count, rates.tile_elements)
    return (gemm.forward_passes * max(flops / forward_rate, traffic)
            + gemm.backward_passes * max(flops / backward_rate, traffic))


@lru_cache(maxsize=8192)  # the search asks for the same (work, micro-batch, GPU) for many configurations
def micro_step_seconds(work: BlockWork, tokens: int, rates: GpuRates, *, flop_scale: float = 1.0) -> float:
    """Compute seconds of one micro-step of `tokens` tokens on one GPU: the GPU's time per op class, or
    the time to launch its kernels when that is longer. `flop_scale` scales GEMMs and attention (a
    profile's measured FLOPs over the analytic count)."""
    if rates.peak_flops <= 0 or rates.hbm_bytes_per_s <= 0:
        return float("inf")
    bandwidth = rates.hbm_bytes_per_s * HBM_EFFICIENCY
    arithmetic = work.layers * sum(gemm_seconds(tokens, g, rates, work.element_bytes) for g in work.gemms)
    if work.head is not None:
        arithmetic += gemm_seconds(tokens, work.head, rates, work.element_bytes)
    if work.fused_attention:
        share = rates.attention_efficiency * (1.0 if rates.flash_attention else MEMORY_EFFICIENT_SHARE)
        arithmetic += tokens * work.attention_flops_per_token / (rates.peak_flops * SUSTAINED_FRACTION * share)
    else:
        eager_rate = rates.peak_flops * SUSTAINED_FRACTION * rates.matmul_efficiency
        arithmetic += tokens * max(work.attention_flops_per_token / eager_rate,
                                   work.attention_bytes_per_token / bandwidth)
    gpu = arithmetic * flop_scale + tokens * work.elementwise_bytes_per_token / bandwidth
    return max(gpu, work.kernels * LAUNCH_SECONDS)

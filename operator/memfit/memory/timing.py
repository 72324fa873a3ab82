"""Step-time model: compute at an efficiency, collectives by interconnect, offload transfers.

Assumptions (each is a named constant below; none is measured by memfit yet):
- FLOPs per sample = tokens x (6 x parameters + 12 x layers x tokens x hidden): the 6N rule for
  forward + backward matmuls (Kaplan et al. 2020, §2.1) plus attention scores (QK^T and AV: 4·s·h
  forward per token and layer, x3 with backward; Chinchilla, Hoffmann et al. 2022, App. F). A
  profile's measured `flops_per_sample` replaces it.
- Recomputation: full checkpointing re-runs every block's forward (x4/3 of the block FLOPs,
  Korthikanti et al. 2023 §5); selective re-runs the attention sub-block only.
- Efficiency: the profile's MFU when it was measured on a CUDA device, otherwise DEFAULT_MFU of the
  GPU's dense peak for the precision (tensor-core bf16/fp16; CUDA-core fp32, because PyTorch leaves
  TF32 matmuls off by default). Small micro-batches reach less: efficiency x t / (t + SATURATION_TOKENS)
  for t tokens per micro-batch and GPU.
- Collectives: ring all-reduce moves 2(N-1)/N x bytes per GPU, reduce-scatter and all-gather
  (N-1)/N (Patarasuk & Yuan 2009; NCCL docs "Performance"); DDP and ZeRO-1/2 move one all-reduce's
  volume per step, ZeRO-3 / FSDP full shard 1.5x that per micro-step (ZeRO paper §7). Hierarchical:
  the intra-node share at the NVLink/PCIe bandwidth, the inter-node share at the node's network
  bandwidth. Half of the communication hides behind compute (OVERLAP).
- Offload: gradients and parameters cross PCIe (PCIE_GBPS per GPU, half overlapped), the optimizer
  steps on the node's CPUs (DeepSpeedCPUAdam rate, ZeRO-Offload, Ren et al. 2021; torch CPU Adam is
  slower), NVMe moves the optimizer state in and out once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.common import Checkpointing, Engine, Offload, PeftMethod, Precision
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy

# Dense-transformer MFU typically reached with bf16 on A100/H100: 35-45 % (Megatron-LM and PaLM
# report 40-55 % for well-tuned large runs; general knowledge, unverified for memfit's trainer).
DEFAULT_MFU = 0.40
# Tokens per micro-batch at which efficiency reaches half of its asymptote (assumption).
SATURATION_TOKENS = 512
# Link bandwidths in GB/s per GPU (bus bandwidth): NVLink (A100 NVLink3 ~300 GB/s per direction),
# PCIe Gen4 x16 ~25 GB/s achievable.
NVLINK_GBPS = 300.0
PCIE_GBPS = 25.0
DEFAULT_INTER_NODE_GBITS = 100.0
# Fraction of communication and offload transfer hidden behind compute.
OVERLAP = 0.5
# CPU Adam throughput per node, parameters per second: DeepSpeedCPUAdam (AVX512) vs torch on CPU.
DS_CPU_ADAM_PARAMS_PER_S = 1.0e9
TORCH_CPU_ADAM_PARAMS_PER_S = 0.25e9
# Local NVMe throughput per node, GB/s (one PCIe Gen4 NVMe drive, read or write).
NVME_GBPS = 3.0


@dataclass(frozen=True, slots=True)
class GpuSpeed:
    """Throughput of one GPU type and the links of its nodes."""

    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    intra_node_gbps: float = NVLINK_GBPS  # GB/s per GPU between GPUs of a node
    inter_node_gbits: float = DEFAULT_INTER_NODE_GBITS  # Gbit/s per node
    pcie_gbps: float = PCIE_GBPS  # GB/s per GPU to host memory

    def peak_flops(self, precision: Precision) -> float:
        """Dense peak FLOP/s for the precision (0 when unsupported)."""
        if precision == Precision.BF16:
            return self.bf16_tflops * 1e12
        if precision == Precision.FP16:
            return self.fp16_tflops * 1e12
        return self.fp32_tflops * 1e12


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds per optimizer step and its parts (exposed communication and offload)."""

    compute_seconds: float
    communication_seconds: float
    offload_seconds: float
    step_seconds: float


def flops_per_sample(shape: Shape) -> float:
    """Training FLOPs (forward + backward) per sample without recomputation."""
    s, h = shape.tokens, shape.hidden
    return s * (6.0 * shape.parameters + 12.0 * shape.layers * s * h)


def recompute_factor(shape: Shape, checkpointing: Checkpointing) -> float:
    """Multiplier on training FLOPs for activation recomputation."""
    if checkpointing == Checkpointing.NONE:
        return 1.0
    s, h, f = shape.tokens, shape.hidden, shape.ffn
    attention = 2.0 * (2 * h * h + 2 * h * shape.kv_hidden) + 4.0 * s * h  # forward, per token and layer
    mlp = 2.0 * (3 if shape.gated_mlp else 2) * h * f
    per_token_total = 6.0 * shape.parameters + 12.0 * shape.layers * s * h
    extra = attention if checkpointing == Checkpointing.SELECTIVE else attention + mlp
    return 1.0 + shape.layers * extra / per_token_total


@dataclass(frozen=True, slots=True)
class TimeTerms:
    """Per-GPU step-time inputs of one strategy at a world size, independent of the GPU type."""

    flops_per_gpu_step: float  # including recomputation
    tokens_per_sample: int
    samples_per_gpu_step: int
    per_step_collective_bytes: float  # ring volume per GPU once per optimizer step
    per_micro_collective_bytes: float  # ring volume per GPU per micro-step
    offload_transfer_bytes_per_step: float  # host<->GPU per step excluding per micro-step
    offload_transfer_bytes_per_micro: float
    cpu_optimizer_params_per_node: float
    cpu_params_per_s: float
    nvme_bytes_per_node: float
    world_size: int
    gpus_per_node: int
    precision: Precision
    mfu: float

    def step_seconds(self, gpu: GpuSpeed, micro_batch: int) -> StepTime:
        """Seconds per optimizer step at `micro_batch` (accumulation keeps the samples per GPU)."""
        accumulation = self.samples_per_gpu_step // micro_batch
        tokens = micro_batch * self.tokens_per_sample
        efficiency = self.mfu * tokens / (tokens + SATURATION_TOKENS)
        peak = gpu.peak_flops(self.precision)
        compute = self.flops_per_gpu_step / (peak * efficiency) if peak > 0 else float("inf")
        volume = self.per_step_collective_bytes + self.per_micro_collective_bytes * accumulation
        comm = volume * self._seconds_per_ring_byte(gpu) if self.world_size > 1 else 0.0
        exposed_comm = comm - OVERLAP * min(comm, compute)
        transfer = (self.offload_transfer_bytes_per_step
                    + self.offload_transfer_bytes_per_micro * accumulation) / (gpu.pcie_gbps * 1e9)
        offload = transfer * (1 - OVERLAP)
        if self.cpu_optimizer_params_per_node:
            offload += self.cpu_optimizer_params_per_node / self.cpu_params_per_s
        if self.nvme_bytes_per_node:
            offload += self.nvme_bytes_per_node / (NVME_GBPS * 1e9)
        total = compute + exposed_comm + offload
        return StepTime(compute, exposed_comm, offload, total)

    def _seconds_per_ring_byte(self, gpu: GpuSpeed) -> float:
        return ring_seconds_per_byte(self.world_size, self.gpus_per_node, gpu)


def ring_seconds_per_byte(world_size: int, gpus_per_node: int, gpu: GpuSpeed) -> float:
    """Seconds per byte of ring volume (bytes x (N-1)/N), split into its intra-node share at the
    NVLink/PCIe bandwidth and its inter-node share at the node's network (hierarchical ring)."""
    n, g = world_size, min(gpus_per_node, world_size)
    if n <= 1:
        return 0.0
    nodes = -(-n // g)
    unit = n / (n - 1)
    seconds = 0.0
    if g > 1:
        seconds += unit * (g - 1) / g / (gpu.intra_node_gbps * 1e9)
    if nodes > 1:
        seconds += unit * (nodes - 1) / nodes / (gpu.inter_node_gbits / 8 * 1e9)
    return seconds


def _adapter_parameters(shape: Shape, strategy: Strategy) -> float | None:
    if strategy.config.peft == PeftMethod.NONE or strategy.adapter is None:
        return None
    return float(shape.layers * strategy.adapter.adapter_parameters_per_block)


def _frozen_base_factor(shape: Shape, adapters: float) -> float:
    """FLOPs of a LoRA/QLoRA step relative to the full fine-tune's: a frozen weight needs no weight
    gradient, so its matmuls cost 4 instead of 6 FLOPs per parameter and token (forward 2, input
    gradient 2); the adapters cost 6 (Hu et al. 2021, §4.2). QLoRA's dequantisation is not counted."""
    s, h = shape.tokens, shape.hidden
    attention = 12.0 * shape.layers * s * h
    full = 6.0 * shape.parameters + attention
    return (4.0 * shape.parameters + 6.0 * adapters + attention) / full if full else 1.0


def time_terms(shape: Shape, strategy: Strategy, *, samples_per_gpu_step: int,
               flops_per_sample_override: float = 0.0, mfu: float | None = None) -> TimeTerms:
    """Step-time inputs of `strategy` with `samples_per_gpu_step` samples per GPU per step."""
    n = strategy.world_size
    ring = (n - 1) / n if n > 1 else 0.0
    p, t = float(shape.parameters), float(shape.trainable)
    adapters = _adapter_parameters(shape, strategy)
    if adapters is not None:
        t = adapters  # LoRA/QLoRA: only the adapters' gradients are exchanged
    mixed = strategy.mixed_precision
    ds = strategy.config.engine == Engine.DEEPSPEED
    param_bytes = 2.0 if mixed else 4.0
    # DeepSpeed reduces 16-bit gradients; DDP (autocast) and FSDP (reduce_dtype) reduce fp32.
    grad_bytes = 2.0 if (mixed and ds) else 4.0
    stage = strategy.config.zero_stage
    per_step = per_micro = 0.0
    if stage <= 1:
        per_step = 2 * ring * t * grad_bytes
    elif stage == 2:
        if ds:
            per_micro = ring * t * grad_bytes
            per_step = ring * p * param_bytes
        else:
            per_micro = ring * (p * param_bytes + t * grad_bytes)
    else:
        per_micro = ring * (2 * p * param_bytes + t * grad_bytes)
    base = flops_per_sample_override or flops_per_sample(shape)
    flops = base * recompute_factor(shape, strategy.config.activation_checkpointing) * samples_per_gpu_step
    if adapters is not None:
        flops *= _frozen_base_factor(shape, adapters)
    transfer_step = transfer_micro = cpu_params = nvme = 0.0
    cpu_rate = DS_CPU_ADAM_PARAMS_PER_S if ds else TORCH_CPU_ADAM_PARAMS_PER_S
    g = min(strategy.gpus_per_node, n)
    if strategy.config.offload != Offload.NONE:
        shard_p, shard_t = p / n, t / n
        cpu_params = shard_t * g
        if strategy.config.engine == Engine.FSDP:
            transfer_micro = 2 * shard_p * 4 + shard_t * 4
        elif stage == 3:
            transfer_micro = 2 * shard_p * param_bytes + shard_t * grad_bytes
        else:
            transfer_micro = shard_t * grad_bytes
            transfer_step = shard_p * param_bytes
        if strategy.config.offload == Offload.NVME:
            nvme = 2 * 12.0 * shard_t * g  # fp32 master + moments read and written once per step
    return TimeTerms(
        flops_per_gpu_step=flops,
        tokens_per_sample=shape.tokens,
        samples_per_gpu_step=samples_per_gpu_step,
        per_step_collective_bytes=per_step,
        per_micro_collective_bytes=per_micro,
        offload_transfer_bytes_per_step=transfer_step,
        offload_transfer_bytes_per_micro=transfer_micro,
        cpu_optimizer_params_per_node=cpu_params,
        cpu_params_per_s=cpu_rate,
        nvme_bytes_per_node=nvme,
        world_size=n,
        gpus_per_node=g,
        precision=strategy.config.precision,
        mfu=mfu if mfu is not None else DEFAULT_MFU,
    )


def estimate_step_seconds(
    shape: Shape, strategy: Strategy, gpu: GpuSpeed, *,
    flops_per_sample_override: float = 0.0, mfu: float | None = None,
) -> StepTime:
    """Seconds per optimizer step of `strategy` (its micro-batch x accumulation samples per GPU)."""
    terms = time_terms(
        shape, strategy, samples_per_gpu_step=strategy.samples_per_gpu_step,
        flops_per_sample_override=flops_per_sample_override, mfu=mfu,
    )
    return terms.step_seconds(gpu, strategy.config.micro_batch_size)

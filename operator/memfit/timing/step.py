"""Step-time model: roofline compute per op class (timing.roofline), collectives by interconnect with
overlap by engine and stage, offload transfers, the optimizer step.

- Compute: timing.roofline, one micro-step at a time: GEMMs (forward, input and weight gradients;
  recomputation repeats the forward), attention, element-wise ops, the loss and kernel launches, each
  against the GPU's peak FLOP/s for the precision (tensor-core bf16/fp16; CUDA-core fp32, because
  PyTorch leaves TF32 matmuls off by default and memfit's trainer does not turn them on), its HBM
  bandwidth and its SM count. A profile's measured `flops_per_sample` scales the arithmetic; a
  profile's MFU measured on a CUDA device replaces the roofline's compute (`mfu`).
- Per micro-step parameter traffic: under autocast (DDP) every forward casts the fp32 weights to 16
  bits (read 4 + write 2 bytes) and the backward accumulates 16-bit weight gradients into fp32 `.grad`
  (read 2 + read/write 8); DeepSpeed and FSDP hold 16-bit parameters (gathered copies written per
  forward and backward at stage 3) and accumulate into their gradient buffers.
- Optimizer step, memory bound: AdamW reads and writes the fp32 parameters and both moments and reads
  the gradient (plus the norm for clipping and the 16-bit copy DeepSpeed/FSDP write back).
- Recomputation: full checkpointing re-runs every block's forward (x4/3 of the block FLOPs,
  Korthikanti et al. 2023 §5); selective re-runs the attention sub-block only.
- Collectives: ring all-reduce moves 2(N-1)/N x bytes per GPU, reduce-scatter and all-gather
  (N-1)/N (Patarasuk & Yuan 2009; NCCL docs "Performance"); DDP and ZeRO-1/2 move one all-reduce's
  volume per step, ZeRO-3 / FSDP full shard 1.5x that per micro-step (ZeRO paper §7). Hierarchical:
  the intra-node share at the NVLink/PCIe bus bandwidth, the inter-node share at the node's network,
  each at the fraction of the link rate NCCL reaches (BUS_EFFICIENCY; nccl-tests' all_reduce bus
  bandwidth on DGX A100 is about 230 of 300 GB/s per direction). Overlap: gradient buckets reduce
  while the backward runs (DDP, ZeRO-1/2 `overlap_comm`) and FSDP / ZeRO-3 prefetch the next unit's
  gather during compute, so a collective hides behind the compute of the same micro-step; at least
  MIN_EXPOSED of it stays exposed (the last bucket, the first gather). DeepSpeed ZeRO-2's parameter
  all-gather after the optimizer step hides behind nothing.
- Offload: gradients and parameters cross PCIe (half overlapped), the optimizer steps on the node's
  CPUs (DeepSpeedCPUAdam rate, ZeRO-Offload, Ren et al. 2021; torch CPU Adam is slower), NVMe moves
  the optimizer state in and out once per step.
- Activation offload: each block's saved activations cross PCIe twice per micro-step (out in forward, back
  in backward), copied on the compute stream (memfit_trainer.activation_offload), so nothing hides them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields
from functools import lru_cache

from memfit.api.common import Checkpointing, Engine, Offload, OptimizerImplementation, PeftMethod, Precision
from memfit.api.job import OptimizerKind
from memfit.memory.activations import activation_terms
from memfit.memory.shape import Shape
from memfit.memory.states import optimizer_state_bytes_per_param
from memfit.memory.strategy import Strategy
from memfit.memory.temporaries import implementation
from memfit.timing.block_work import arithmetic_flops_per_token, block_work, counted_flops_per_sample
from memfit.timing.roofline import (
    FLASH_EFFICIENCY,
    HBM_EFFICIENCY,
    TILE_ELEMENTS,
    BlockWork,
    GpuRates,
    micro_step_seconds,
)

# Link bandwidths in GB/s per GPU and direction when a pool does not say: NVLink 3 (A100, 12 links x
# 25 GB/s), PCIe Gen4 x16 achievable.
NVLINK_GBPS = 300.0
PCIE_GBPS = 25.0
DEFAULT_INTER_NODE_GBITS = 100.0
# Fraction of the link rate NCCL collectives reach (nccl-tests bus bandwidth, see above).
BUS_EFFICIENCY = 0.75
# Share of a collective that stays exposed however much compute there is to hide it behind.
MIN_EXPOSED = 0.15
# Fraction of offload transfers hidden behind compute.
OVERLAP = 0.5
# CPU Adam throughput per node, parameters per second: DeepSpeedCPUAdam (AVX512) vs torch on CPU.
DS_CPU_ADAM_PARAMS_PER_S = 1.0e9
TORCH_CPU_ADAM_PARAMS_PER_S = 0.25e9
# Local NVMe throughput per node, GB/s (one PCIe Gen4 NVMe drive, read or write).
NVME_GBPS = 3.0
# What the roofline assumes of a GPU nothing describes: HBM2-class bandwidth, an A100's SM count and the
# middle of the measured MAMF efficiencies (timing.roofline).
UNKNOWN_HBM_GBPS = 900.0
UNKNOWN_SM_COUNT = 108
DEFAULT_MATMUL_EFFICIENCY = 0.80
# Bounds on a learned compute factor (measured / predicted step time): beyond them the measurement is
# broken, not a calibration.
MIN_LEARNED_FACTOR, MAX_LEARNED_FACTOR = 0.25, 4.0


@dataclass(frozen=True, slots=True)
class GpuSpeed:
    """Throughput of one GPU type and the links of its nodes, and the compute factors learned from
    measured step times on it, per (precision, engine)."""

    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    tf32_tflops: float = 0.0  # tensor-core TF32, used for fp32 matmuls only where TF32 is allowed
    intra_node_gbps: float = NVLINK_GBPS  # GB/s per GPU and direction between GPUs of a node
    inter_node_gbits: float = DEFAULT_INTER_NODE_GBITS  # Gbit/s per node
    pcie_gbps: float = PCIE_GBPS  # GB/s per GPU to host memory
    hbm_gbps: float = UNKNOWN_HBM_GBPS
    sm_count: int = UNKNOWN_SM_COUNT
    matmul_efficiency: float = DEFAULT_MATMUL_EFFICIENCY
    flash_attention: bool = True  # FlashAttention-2 kernels (compute capability >= 8.0)
    architecture: str = "ampere"  # volta | turing | ampere | ada | hopper | blackwell (timing.roofline)
    learned: tuple[tuple[Precision, Engine, float], ...] = field(default=())
    # The planner keys its caches by speed, thousands of times a plan: hash the fields once.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare)))

    def __hash__(self) -> int:
        return self._hash

    def peak_flops(self, precision: Precision, *, tf32: bool = False) -> float:
        """Dense peak FLOP/s for the precision (0 when unsupported); fp32 matmuls on TF32 tensor cores
        with `tf32` (torch.backends.cuda.matmul.allow_tf32) where the GPU has them."""
        if precision in (Precision.BF16, Precision.BF16_PURE):
            return self.bf16_tflops * 1e12
        if precision == Precision.FP16:
            return self.fp16_tflops * 1e12
        if tf32 and self.tf32_tflops > 0:
            return self.tf32_tflops * 1e12
        return self.fp32_tflops * 1e12

    def rates(self, precision: Precision, *, tf32: bool = False) -> GpuRates:
        """The roofline's view of this GPU at `precision`."""
        return _rates(self, precision, tf32)

    def _build_rates(self, precision: Precision, tf32: bool) -> GpuRates:
        half = precision in (Precision.BF16, Precision.FP16, Precision.BF16_PURE)
        return GpuRates(peak_flops=self.peak_flops(precision, tf32=tf32), hbm_bytes_per_s=self.hbm_gbps * 1e9,
                        sm_count=self.sm_count, matmul_efficiency=self.matmul_efficiency,
                        flash_attention=self.flash_attention and half,
                        attention_efficiency=FLASH_EFFICIENCY.get(self.architecture, FLASH_EFFICIENCY["ampere"]),
                        tile_elements=TILE_ELEMENTS.get(self.architecture, TILE_ELEMENTS["ampere"]))

    def learned_factor(self, precision: Precision, engine: Engine) -> float:
        """Measured / predicted compute time learned on this GPU for this precision and engine. An engine
        not measured yet at this precision takes the median of the engines that were (the same GPU and
        precision run the same kernels). A precision not measured at all takes the median of everything
        measured on this GPU when that is a slowdown (the host, clocks or input pipeline that made those
        runs slow are the GPU's, not the precision's), and nothing from a speedup: a configuration nobody
        ran is never planned faster than the model says."""
        same = sorted(f for p, _, f in self.learned if p == precision)
        for p, e, factor in self.learned:
            if p == precision and e == engine:
                return factor
        if same:
            return statistics.median(same)
        if not self.learned:
            return 1.0
        return max(1.0, statistics.median(f for _, _, f in self.learned))

    def lowest_learned_factor(self, precision: Precision) -> float:
        """The smallest learned factor of any engine at `precision` (bounds must hold for all)."""
        return min([1.0, *(f for p, _, f in self.learned if p == precision)])


@lru_cache(maxsize=1024)
def _rates(speed: GpuSpeed, precision: Precision, tf32: bool) -> GpuRates:
    return speed._build_rates(precision, tf32)


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds per optimizer step and its parts (exposed communication and offload)."""

    compute_seconds: float
    communication_seconds: float
    offload_seconds: float
    step_seconds: float


def flops_per_sample(shape: Shape) -> float:
    """Training FLOPs (forward + backward) per sample without recomputation: 6 x parameters per token
    (Kaplan et al. 2020, §2.1) plus attention scores (Chinchilla, Hoffmann et al. 2022, App. F). The
    conventional MFU numerator; the roofline counts the GEMMs and attention it actually runs."""
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
    if checkpointing == Checkpointing.SELECTIVE_OP:
        return 1.0  # every matmul and the attention kernel's output is kept: only element-wise ops re-run
    extra = attention if checkpointing == Checkpointing.SELECTIVE else attention + mlp
    return 1.0 + shape.layers * extra / per_token_total


@dataclass(frozen=True, slots=True)
class EngineTraffic:
    """The parts of a step that depend on the engine, sharding and offload but not on the arithmetic
    (the same for every precision of one width and every checkpointing): HBM traffic that scales with
    the parameters, and offload transfers and CPU/NVMe work."""

    param_bytes_per_micro: float = 0.0  # weight casts, gathered copies, gradient accumulation
    optimizer_bytes: float = 0.0  # the optimizer step's HBM traffic on this GPU
    offload_transfer_bytes_per_step: float = 0.0  # host<->GPU per step excluding per micro-step
    offload_transfer_bytes_per_micro: float = 0.0
    cpu_optimizer_params_per_node: float = 0.0
    cpu_params_per_s: float = 1.0
    nvme_bytes_per_node: float = 0.0
    activation_transfer_bytes_per_sample: float = 0.0  # activation offload, both directions

    def hbm_bytes(self, accumulation: int) -> float:
        """HBM bytes of one optimizer step of `accumulation` micro-steps."""
        return accumulation * self.param_bytes_per_micro + self.optimizer_bytes

    def offload_seconds(self, gpu: GpuSpeed, accumulation: int, samples: int = 0) -> float:
        """Seconds of one optimizer step of `samples` per GPU spent on CPU/NVMe offload that nothing hides."""
        transfer = (self.offload_transfer_bytes_per_step
                    + self.offload_transfer_bytes_per_micro * accumulation) / (gpu.pcie_gbps * 1e9)
        offload = transfer * (1 - OVERLAP) + samples * self.activation_transfer_bytes_per_sample / (gpu.pcie_gbps * 1e9)
        if self.cpu_optimizer_params_per_node:
            offload += self.cpu_optimizer_params_per_node / self.cpu_params_per_s
        if self.nvme_bytes_per_node:
            offload += self.nvme_bytes_per_node / (NVME_GBPS * 1e9)
        return offload


@dataclass(frozen=True, slots=True)
class TimeTerms:
    """Per-GPU step-time inputs of one strategy at a world size, independent of the GPU type."""

    flops_per_gpu_step: float  # conventional training FLOPs incl. recomputation (the MFU numerator)
    tokens_per_sample: int
    samples_per_gpu_step: int
    per_step_collective_bytes: float  # ring volume per GPU once per optimizer step, hidden behind a backward
    per_micro_collective_bytes: float  # ring volume per GPU per micro-step, hidden behind its compute
    world_size: int
    gpus_per_node: int
    precision: Precision
    mfu: float | None  # measured on a CUDA device: replaces the roofline's compute
    engine: Engine = Engine.DDP
    work: BlockWork | None = None
    flop_scale: float = 1.0  # measured / analytic FLOPs of the profile
    traffic: EngineTraffic = EngineTraffic()
    exposed_step_collective_bytes: float = 0.0  # a per-step collective nothing hides (ZeRO-2 gather)
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores (memfit's trainer leaves them off)

    def traffic_bytes(self, micro_batch: int) -> float:
        """HBM bytes of one optimizer step that depend on the engine: per micro-step parameter traffic
        and the optimizer step."""
        return self.traffic.hbm_bytes(self.samples_per_gpu_step // micro_batch)

    def compute_seconds(self, gpu: GpuSpeed, micro_batch: int, *, floor: bool = False,
                        floor_traffic_bytes: float = 0.0) -> float:
        """Compute seconds of one optimizer step at `micro_batch`; `floor`: with `floor_traffic_bytes` of
        engine traffic instead of its own (the least of a group's engines) and the lowest learned factor
        of the precision (a bound for every engine)."""
        accumulation = self.samples_per_gpu_step // micro_batch
        peak = gpu.peak_flops(self.precision, tf32=self.tf32)
        if peak <= 0:
            return float("inf")
        if self.mfu is not None or self.work is None:
            seconds = self.flops_per_gpu_step / (peak * (self.mfu or DEFAULT_MATMUL_EFFICIENCY / 2))
        else:
            rates = gpu.rates(self.precision, tf32=self.tf32)
            tokens = micro_batch * self.tokens_per_sample
            seconds = accumulation * micro_step_seconds(self.work, tokens, rates, flop_scale=self.flop_scale)
            traffic = floor_traffic_bytes if floor else self.traffic_bytes(micro_batch)
            if traffic:
                seconds += traffic / (rates.hbm_bytes_per_s * HBM_EFFICIENCY)
        factor = gpu.lowest_learned_factor(self.precision) if floor else gpu.learned_factor(self.precision, self.engine)
        if factor >= 1.0 or self.work is None or self.mfu is not None:
            return seconds * factor
        # A learned speedup never makes the compute faster than its arithmetic at the GPU's peak.
        tokens = micro_batch * self.tokens_per_sample
        at_peak = accumulation * tokens * arithmetic_flops_per_token(self.work) * self.flop_scale / peak
        return max(seconds * factor, at_peak)

    def step_seconds(self, gpu: GpuSpeed, micro_batch: int) -> StepTime:
        """Seconds per optimizer step at `micro_batch` (accumulation keeps the samples per GPU)."""
        accumulation = self.samples_per_gpu_step // micro_batch
        compute = self.compute_seconds(gpu, micro_batch)
        exposed_comm = 0.0
        if self.world_size > 1:
            per_byte = ring_seconds_per_byte(self.world_size, self.gpus_per_node, gpu)
            micro_compute = compute / accumulation
            micro_comm = self.per_micro_collective_bytes * per_byte
            step_comm = self.per_step_collective_bytes * per_byte
            exposed_comm = (accumulation * exposed(micro_comm, micro_compute)
                            + exposed(step_comm, micro_compute * 2 / 3)
                            + self.exposed_step_collective_bytes * per_byte)
        offload = self.offload_seconds(gpu, micro_batch)
        total = compute + exposed_comm + offload
        return StepTime(compute, exposed_comm, offload, total)

    def offload_seconds(self, gpu: GpuSpeed, micro_batch: int) -> float:
        """Seconds of one optimizer step spent on CPU/NVMe offload that nothing hides."""
        return self.traffic.offload_seconds(gpu, self.samples_per_gpu_step // micro_batch, self.samples_per_gpu_step)


def exposed(comm: float, window: float) -> float:
    """The part of a collective of `comm` seconds not hidden behind `window` seconds of compute."""
    return max(comm - window, MIN_EXPOSED * comm)


def ring_seconds_per_byte(world_size: int, gpus_per_node: int, gpu: GpuSpeed) -> float:
    """Seconds per byte of ring volume (bytes x (N-1)/N), split into its intra-node share at the
    NVLink/PCIe bandwidth and its inter-node share at the node's network (hierarchical ring), each at
    BUS_EFFICIENCY of the link."""
    n, g = world_size, min(gpus_per_node, world_size)
    if n <= 1:
        return 0.0
    nodes = -(-n // g)
    unit = n / (n - 1)
    seconds = 0.0
    if g > 1:
        seconds += unit * (g - 1) / g / (gpu.intra_node_gbps * 1e9 * BUS_EFFICIENCY)
    if nodes > 1:
        seconds += unit * (nodes - 1) / nodes / (gpu.inter_node_gbits / 8 * 1e9 * BUS_EFFICIENCY)
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


def _param_bytes_per_micro(strategy: Strategy, p: float, t: float) -> float:
    """HBM bytes per micro-step that scale with the parameters on one GPU: weight casts and gathered
    copies, gradient accumulation (see the module docstring)."""
    config, n = strategy.config, strategy.world_size
    mixed = strategy.mixed_precision
    stage = config.zero_stage
    if strategy.pure_bf16:
        # bf16 weights used as they are, bf16 gradients accumulated (read and written)
        gathered = 2.0 * 2.0 * p if (config.engine != Engine.DDP and stage >= 3) else 0.0
        return gathered + 4.0 * t / (n if config.engine != Engine.DDP else 1)
    if config.engine == Engine.DDP:
        return (6.0 * t + 12.0 * t) if mixed else 8.0 * t
    sharded = stage >= 3
    gathered = (2.0 * 2.0 if mixed else 2.0 * 4.0) * p if sharded else 0.0
    grads = (4.0 + 8.0 / n) * t if mixed else 8.0 * t / (n if stage >= 2 else 1)
    return gathered + grads


# Adam/AdamW's step as separate ops (torch foreach or the per-tensor loop) moves more than one fused pass:
# the denominator temporary written by sqrt, read and written by the division and the eps add, read by
# addcdiv (24 B); the second moment's extra pass (mul_ then addcmul_: 8 B), the gradient read again (4 B)
# and the decoupled decay's own pass over the weight (8 B). The loop's launch overhead (a few µs per op and
# tensor) is not modelled: the planner never picks the loop.
UNFUSED_ADAM_EXTRA_BYTES = 44.0


def _optimizer_bytes(strategy: Strategy, t: float) -> float:
    """HBM bytes of the optimizer step on one GPU: fp32 parameters read and written, the gradient read
    twice (clipping norm and update), the states read and written, the 16-bit copy written back; one op
    per pass without a fused kernel (`UNFUSED_ADAM_EXTRA_BYTES`)."""
    config, n = strategy.config, strategy.world_size
    if config.offload != Offload.NONE:
        return 0.0  # the step runs on the CPU (offload terms)
    shard = t / n if (config.zero_stage >= 1 and config.engine != Engine.DDP) else t
    states = optimizer_state_bytes_per_param(strategy.optimizer, eight_bit=config.optimizer8bit)
    if strategy.pure_bf16:
        # bf16 weight read and written, gradient read, bf16 states read and written, the rounding's
        # 4-byte noise written and read (memfit_trainer.stochastic_rounding)
        return shard * (2.0 + 2.0 + 2.0 + states + 8.0)
    copy = 2.0 if (strategy.mixed_precision and config.engine != Engine.DDP) else 0.0
    passes = 0.0
    if strategy.optimizer != OptimizerKind.SGD and not config.optimizer8bit and \
            implementation(strategy) != OptimizerImplementation.FUSED:
        passes = UNFUSED_ADAM_EXTRA_BYTES
    return shard * (8.0 + 8.0 + 2.0 * states + copy + passes)


def _wire_bytes(strategy: Strategy) -> tuple[float, float]:
    """Bytes per parameter and per gradient element moved between GPUs (and to the host): DeepSpeed
    reduces 16-bit gradients; DDP (autocast) and FSDP (reduce_dtype) reduce fp32."""
    mixed = strategy.mixed_precision
    if strategy.pure_bf16:
        return 2.0, 2.0
    return (2.0 if mixed else 4.0), (2.0 if (mixed and strategy.config.engine == Engine.DEEPSPEED) else 4.0)


@lru_cache(maxsize=4096)  # pure; the planner asks for every engine's plan after plan
def engine_traffic(shape: Shape, strategy: Strategy) -> EngineTraffic:
    """`strategy`'s EngineTraffic (what its engine, sharding and offload add to a step)."""
    n = strategy.world_size
    p, t = float(shape.parameters), float(shape.trainable)
    adapters = _adapter_parameters(shape, strategy)
    if adapters is not None:
        t = adapters
    ds = strategy.config.engine == Engine.DEEPSPEED
    param_bytes, grad_bytes = _wire_bytes(strategy)
    stage = strategy.config.zero_stage
    transfer_step = transfer_micro = cpu_params = nvme = 0.0
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
    return EngineTraffic(
        param_bytes_per_micro=_param_bytes_per_micro(strategy, p, t),
        optimizer_bytes=_optimizer_bytes(strategy, t),
        offload_transfer_bytes_per_step=transfer_step,
        offload_transfer_bytes_per_micro=transfer_micro,
        cpu_optimizer_params_per_node=cpu_params,
        cpu_params_per_s=DS_CPU_ADAM_PARAMS_PER_S if ds else TORCH_CPU_ADAM_PARAMS_PER_S,
        nvme_bytes_per_node=nvme,
        activation_transfer_bytes_per_sample=(2 * activation_terms(shape, strategy).offloaded_bytes_per_sample
                                              if strategy.config.activation_offload else 0.0),
    )


@lru_cache(maxsize=4096)  # pure; the planner asks for the same terms plan after plan
def time_terms(shape: Shape, strategy: Strategy, *, samples_per_gpu_step: int,
               flops_per_sample_override: float = 0.0, mfu: float | None = None, tf32: bool = False) -> TimeTerms:
    """Step-time inputs of `strategy` with `samples_per_gpu_step` samples per GPU per step."""
    n = strategy.world_size
    ring = (n - 1) / n if n > 1 else 0.0
    p, t = float(shape.parameters), float(shape.trainable)
    adapters = _adapter_parameters(shape, strategy)
    if adapters is not None:
        t = adapters  # LoRA/QLoRA: only the adapters' gradients are exchanged
    ds = strategy.config.engine == Engine.DEEPSPEED
    param_bytes, grad_bytes = _wire_bytes(strategy)
    stage = strategy.config.zero_stage
    per_step = per_micro = exposed_step = 0.0
    if stage <= 1:
        per_step = 2 * ring * t * grad_bytes
    elif stage == 2:
        if ds:
            per_micro = ring * t * grad_bytes
            exposed_step = ring * p * param_bytes
        else:
            per_micro = ring * (p * param_bytes + t * grad_bytes)
    else:
        per_micro = ring * (2 * p * param_bytes + t * grad_bytes)
    g = min(strategy.gpus_per_node, n)
    counted = counted_flops_per_sample(shape)
    base = flops_per_sample_override or flops_per_sample(shape)
    flops = base * recompute_factor(shape, strategy.config.activation_checkpointing) * samples_per_gpu_step
    if adapters is not None:
        flops *= _frozen_base_factor(shape, adapters)
    return TimeTerms(
        flops_per_gpu_step=flops,
        tokens_per_sample=shape.tokens,
        samples_per_gpu_step=samples_per_gpu_step,
        per_step_collective_bytes=per_step,
        per_micro_collective_bytes=per_micro,
        world_size=n,
        gpus_per_node=g,
        precision=strategy.config.precision,
        mfu=mfu,
        engine=strategy.config.engine,
        work=block_work(shape, strategy),
        flop_scale=flops_per_sample_override / counted if flops_per_sample_override and counted else 1.0,
        traffic=engine_traffic(shape, strategy),
        exposed_step_collective_bytes=exposed_step,
        tf32=tf32,
    )


def estimate_step_seconds(
    shape: Shape, strategy: Strategy, gpu: GpuSpeed, *,
    flops_per_sample_override: float = 0.0, mfu: float | None = None, tf32: bool = False,
) -> StepTime:
    """Seconds per optimizer step of `strategy` (its micro-batch x accumulation samples per GPU)."""
    terms = time_terms(
        shape, strategy, samples_per_gpu_step=strategy.samples_per_gpu_step,
        flops_per_sample_override=flops_per_sample_override, mfu=mfu, tf32=tf32,
    )
    return terms.step_seconds(gpu, strategy.config.micro_batch_size)

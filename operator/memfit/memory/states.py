"""Model states per GPU: parameters, gradients and optimizer state, and what offload puts on the host.

Bytes per parameter by regime (shared/reference/memory-model.md §1):
- fp32 (DDP, FSDP, DeepSpeed): weights 4, gradients 4, Adam 8 (m, v) = 16 B/param (accelerate's
  fp32 estimate; ZeRO paper §3 baseline).
- DDP/FSDP mixed precision keep fp32 weights and gradients (torch.autocast; FSDP2
  MixedPrecisionPolicy with fp32 sharded parameters and reduce_dtype fp32), so model states stay
  16 B/param; the 16-bit copies are transient (see temporaries.py).
- DeepSpeed mixed precision: 16-bit weights 2 + fp32 master 4 + Adam 8 persist (the ZeRO paper's
  2 + K with K = 12); the ZeRO optimizers keep the fp32 master partition even when the model itself is
  fp32 (`single_partition_of_fp32_groups`, `fp32_partitioned_groups_flat`), so fp32 ZeRO >= 1 pays
  4 B/param on top of the moments, while fp32 without ZeRO (stage 0) steps the model's own parameters.
  Gradients (16-bit as backward produces them, the fp32 partition DeepSpeed builds for the step) are
  phase terms (temporaries.py); `gradients_bytes` here is what the step holds, the figure DeepSpeed's
  estimators count in their `18Ψ/N` (stage3.py) and `2Ψ + 18Ψ/N` (stage_1_and_2.py): 4 + 12 + 2.
- Sharding (ZeRO paper, Rajbhandari et al. 2020, §5): stage >= 1 divides the optimizer state by N,
  >= 2 the gradients, 3 the parameters.
- bitsandbytes 8-bit Adam: uint8 state1/state2 + one fp32 absmax per 256-element block =
  2 x (1 + 4/256) = 2.03 B/param (Dettmers et al. 2022; bitsandbytes/optim/optimizer.py); tensors
  under 4096 elements keep 32-bit state.
- bf16-pure (DDP, FSDP): bf16 weights 2, gradients 2 and optimizer state in bf16 (Adam 4, SGD 2) =
  8 B/param for Adam (torchtune's bf16 full fine-tune; torchao AdamW with bf16 state); buffers are
  counted as the model declares them (an upper bound: float buffers are cast with the model).
- Offload (DeepSpeed estimators): host RAM carries a 1.5 `additional_buffer_factor` for pinned
  buffers (stage_1_and_2.py / stage3.py `estimate_zero*_model_states_mem_needs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.common import Engine, Offload
from memfit.api.job import OptimizerKind
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy

# Adam/AdamW: two fp32 moments (Kingma & Ba; ZeRO paper K counts them with the fp32 master as 12).
ADAM_STATE_BYTES = 8.0
# SGD with momentum: one fp32 buffer (torch.optim.SGD momentum_buffer; memfit trains with momentum).
SGD_STATE_BYTES = 4.0
# bitsandbytes blockwise 8-bit state: 1 byte per element + fp32 absmax per 256-element block.
BNB_BYTES_PER_STATE = 1.0 + 4.0 / 256.0
# DeepSpeed mixed precision: fp32 master weights (ZeRO paper K); the fp32 gradient partition the step
# builds (on the host when the optimizer is offloaded).
FP32_MASTER_BYTES = 4.0
FP32_GRAD_PARTITION_BYTES = 4.0
# DeepSpeed estimators' `additional_buffer_factor` for host (pinned) memory.
HOST_BUFFER_FACTOR = 1.5
# ZeRO-Infinity pinned swap buffers on the host: optimizer `buffer_count` 4 x `buffer_size` 1e8
# elements fp32 + parameter `buffer_count` 5 x 1e8 fp16 (DeepSpeed config defaults; unverified).
NVME_SWAP_BUFFER_BYTES = 4 * 100_000_000 * 4 + 5 * 100_000_000 * 2


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Persistent per-GPU bytes of the model states, and host/NVMe bytes per GPU for offload."""

    parameters_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    host_bytes: float = 0.0
    nvme_bytes: float = 0.0


def optimizer_state_bytes_per_param(kind: OptimizerKind, *, eight_bit: bool) -> float:
    """Optimizer state per trainable parameter, excluding any fp32 master copy."""
    states = 1 if kind == OptimizerKind.SGD else 2
    if eight_bit:
        return states * BNB_BYTES_PER_STATE
    return SGD_STATE_BYTES if kind == OptimizerKind.SGD else ADAM_STATE_BYTES


def zero_model_state_bytes(*, parameters: float, stage: int, dp_degree: int, k: float = 12.0) -> float:
    """The ZeRO paper's per-GPU model states for mixed-precision Adam (Rajbhandari et al. 2020, §5.1).

    stage 0: (2+2+K)Ψ; 1: 2Ψ + 2Ψ + KΨ/N; 2: 2Ψ + (2+K)Ψ/N; 3: (2+2+K)Ψ/N.
    """
    n, psi = dp_degree, parameters
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / n
    if stage == 2:
        return 2 * psi + (2 + k) * psi / n
    return (4 + k) * psi / n


def _optimizer_bytes(shape: Shape, strategy: Strategy) -> float:
    """Optimizer state of all trainable parameters (unsharded), bnb small tensors at 32 bits."""
    full = optimizer_state_bytes_per_param(strategy.optimizer, eight_bit=False)
    if not strategy.config.optimizer8bit:
        return full * shape.trainable
    small = shape.small_trainable
    eight = optimizer_state_bytes_per_param(strategy.optimizer, eight_bit=True)
    return eight * (shape.trainable - small) + full * small


def model_states(shape: Shape, strategy: Strategy) -> ModelStates:
    """Per-GPU model states of `strategy` (see the module docstring for the byte counts)."""
    n = strategy.world_size
    p, t = float(shape.parameters), float(shape.trainable)
    if strategy.pure_bf16:
        # bf16 weights, gradients and optimizer state (memfit_trainer.stochastic_rounding): half of
        # every fp32 term, no master copy; FSDP shards all three.
        # (8-bit state is the same as under any precision; bitsandbytes keeps fp32 state for small tensors)
        optim = _optimizer_bytes(shape, strategy) / (1 if strategy.config.optimizer8bit else 2)
        shards = n if strategy.config.engine == Engine.FSDP else 1
        return ModelStates(2 * p / shards + shape.buffer_bytes, 2 * t / shards, optim / shards)
    optim = _optimizer_bytes(shape, strategy)
    if strategy.config.engine == Engine.DDP:
        return ModelStates(4 * p + shape.buffer_bytes, 4 * t, optim)
    if strategy.config.engine == Engine.FSDP:
        # FSDP2 keeps fp32 sharded parameters and gradients; every state is divided by N.
        sharded = ModelStates((4 * p) / n + shape.buffer_bytes, (4 * t) / n, optim / n)
        if strategy.config.offload == Offload.CPU:
            # CPUOffloadPolicy: sharded parameters, gradients and the optimizer live in host RAM.
            host = (sharded.parameters_bytes + sharded.gradients_bytes + sharded.optimizer_bytes)
            return ModelStates(float(shape.buffer_bytes), 0.0, 0.0, host * HOST_BUFFER_FACTOR)
        return sharded
    return _deepspeed_states(shape, strategy, optim)


def _deepspeed_states(shape: Shape, strategy: Strategy, optim: float) -> ModelStates:
    n, stage = strategy.world_size, strategy.config.zero_stage
    p, t = float(shape.parameters), float(shape.trainable)
    weight_bytes = 2.0 if strategy.mixed_precision else 4.0
    if strategy.mixed_precision or stage >= 1:
        optim += FP32_MASTER_BYTES * t
    params = weight_bytes * p / (n if stage == 3 else 1)
    optimizer = optim / (n if stage >= 1 else 1)
    # What the optimizer step holds: the fp32 gradient partition (stage 0: every fp32 gradient).
    grads = FP32_GRAD_PARTITION_BYTES * t / (n if stage >= 1 else 1)
    buffers = float(shape.buffer_bytes)
    grad_partition = FP32_GRAD_PARTITION_BYTES * t / n
    if strategy.config.offload == Offload.CPU:
        # ZeRO-Offload: optimizer state and its fp32 gradient partition in host RAM; gradients
        # stream to the host through the reduce buckets (temporaries). At stage 3 the parameters
        # go too (offload_param), leaving only the gathered working set on the GPU.
        host = optimizer + grad_partition
        gpu_params = params
        if stage == 3:
            host += params
            gpu_params = 0.0
        return ModelStates(gpu_params + buffers, 0.0, 0.0, host * HOST_BUFFER_FACTOR)
    if strategy.config.offload == Offload.NVME:
        # ZeRO-Infinity: 16-bit parameters and fp32 master + moments on NVMe; the fp32 gradient
        # partition and pinned swap buffers stay in host RAM.
        nvme = params + optimizer
        host = grad_partition * HOST_BUFFER_FACTOR + NVME_SWAP_BUFFER_BYTES
        return ModelStates(buffers, 0.0, 0.0, host, nvme)
    return ModelStates(params + buffers, grads, optimizer)

"""A concrete training strategy (no `auto` left): the input of the memory and time models."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import OptimizerKind


class Device(StrEnum):
    """Where the training step runs: the allocator and the optimizer kernels differ (temporaries.py)."""

    CUDA = "cuda"
    CPU = "cpu"


@dataclass(frozen=True, slots=True)
class Strategy:
    """Engine, sharding, precision and memory savers of one candidate, plus its batch layout.

    `zero_stage` is the DeepSpeed ZeRO stage; for FSDP 2 means SHARD_GRAD_OP (parameters stay
    gathered between forward and backward) and 3 FULL_SHARD; DDP is stage 0. Offload `cpu` moves the
    optimizer state (and at stage 3 also the parameters) to host RAM; `nvme` (DeepSpeed ZeRO-3,
    ZeRO-Infinity) moves both to local NVMe. `device` is where the step runs: GPUs for every plan;
    `cpu` predicts a CPU run (the profiling stand-in and the accuracy benchmark's truth).
    """

    engine: Engine = Engine.DDP
    zero_stage: int = 0
    precision: Precision = Precision.FP32
    checkpointing: Checkpointing = Checkpointing.NONE
    offload: Offload = Offload.NONE
    optimizer8bit: bool = False
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    world_size: int = 1
    gpus_per_node: int = 1
    micro_batch_size: int = 1
    accumulation_steps: int = 1
    device: Device = Device.CUDA

    @property
    def mixed_precision(self) -> bool:
        """bf16 or fp16 compute."""
        return self.precision in (Precision.BF16, Precision.FP16)

    @property
    def nodes(self) -> int:
        """Nodes spanned (ceil of world size / GPUs per node)."""
        return -(-self.world_size // self.gpus_per_node)

    @property
    def samples_per_gpu_step(self) -> int:
        """Samples each GPU processes per optimizer step."""
        return self.micro_batch_size * self.accumulation_steps

    def describe(self) -> str:
        """Short human form: `deepspeed ZeRO-2 bf16 ckpt-full offload-cpu 8-bit mbs 2x4`."""
        if self.engine == Engine.DEEPSPEED:
            parts = [f"ZeRO-{self.zero_stage}"]
        elif self.engine == Engine.FSDP:
            parts = ["FSDP-full-shard" if self.zero_stage == 3 else "FSDP-grad-op"]
        else:
            parts = ["DDP"]
        parts.append(self.precision.value)
        if self.checkpointing != Checkpointing.NONE:
            parts.append(f"ckpt-{self.checkpointing.value}")
        if self.offload != Offload.NONE:
            parts.append(f"offload-{self.offload.value}")
        if self.optimizer8bit:
            parts.append("8-bit-optim")
        parts.append(f"mbs {self.micro_batch_size}x{self.accumulation_steps}")
        return " ".join(parts)


def strategy_problem(strategy: Strategy) -> str | None:
    """Why this combination cannot run (None when it can). Pure checks, no shape needed."""
    engine, stage, offload = strategy.engine, strategy.zero_stage, strategy.offload
    if engine not in (Engine.DDP, Engine.FSDP, Engine.DEEPSPEED):
        return f"engine must be ddp, fsdp or deepspeed, got {engine.value}"
    if strategy.precision == Precision.AUTO or strategy.checkpointing == Checkpointing.AUTO:
        return "precision and checkpointing must be concrete, not auto"
    if offload == Offload.AUTO:
        return "offload must be concrete, not auto"
    if not 0 <= stage <= 3:
        return f"ZeRO stage must be 0..3, got {stage}"
    if engine == Engine.DDP and stage != 0:
        return f"DDP does not shard: ZeRO stage {stage} needs fsdp or deepspeed"
    if engine == Engine.FSDP and stage not in (2, 3):
        return f"FSDP shards at stage 2 (grad-op) or 3 (full shard), not {stage}"
    if offload != Offload.NONE and engine == Engine.DDP:
        return "DDP cannot offload; offload needs fsdp or deepspeed"
    if offload == Offload.NVME and (engine != Engine.DEEPSPEED or stage != 3):
        # ZeRO-Infinity: NVMe offload of parameters and optimizer state is a ZeRO-3 feature.
        return "NVMe offload needs DeepSpeed ZeRO-3"
    if offload == Offload.CPU and engine == Engine.DEEPSPEED and stage == 0:
        return "DeepSpeed offloads the optimizer only with ZeRO stage 1, 2 or 3"
    if strategy.optimizer8bit and offload != Offload.NONE:
        # Offloaded optimizers step on the CPU (DeepSpeedCPUAdam, torch on CPU); bitsandbytes is CUDA-only.
        return "an 8-bit (bitsandbytes) optimizer cannot run with optimizer offload"
    if min(strategy.world_size, strategy.gpus_per_node, strategy.micro_batch_size,
           strategy.accumulation_steps) < 1:
        return "world size, GPUs per node, micro-batch and accumulation must be >= 1"
    return None

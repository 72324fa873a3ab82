"""A concrete training strategy (no `auto` left): the input of the memory and time models."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from memfit.api.common import (
    Checkpointing,
    Engine,
    Offload,
    OptimizerImplementation,
    PeftMethod,
    Precision,
    Toggle,
)
from memfit.api.job import OptimizerKind, StrategySpec
from memfit.api.peft_rules import peft_engine_problem
from memfit.api.training_config import PLAIN_FP32_DDP, TrainingConfig
from memfit.api.training_config import accumulation_steps as accumulation_steps_for
from memfit.memory.adapter import AdapterLayout
from memfit.memory.technique_rules import technique_problem


class Device(StrEnum):
    """Where the training step runs: the allocator and the optimizer kernels differ (temporaries.py)."""

    CUDA = "cuda"
    CPU = "cpu"


@dataclass(frozen=True, slots=True)
class Strategy:
    """A training configuration (`memfit.api.training_config.TrainingConfig`: engine, sharding,
    precision, memory savers, batch split) at a layout, with the optimizer and the device it runs on.

    `device` is where the step runs: GPUs for every plan; `cpu` predicts a CPU run (the profiling
    stand-in and the accuracy benchmark's truth). `adapter` is the LoRA/QLoRA layout a configuration
    with `config.peft` other than none trains (memory/peft.py).
    """

    config: TrainingConfig = PLAIN_FP32_DDP
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    world_size: int = 1
    gpus_per_node: int = 1
    device: Device = Device.CUDA
    adapter: AdapterLayout | None = None

    @property
    def mixed_precision(self) -> bool:
        """bf16 or fp16 compute over fp32 weights or an fp32 master copy (not bf16-pure)."""
        return self.config.precision in (Precision.BF16, Precision.FP16)

    @property
    def pure_bf16(self) -> bool:
        """bf16 weights, gradients and optimizer state with no fp32 copy (memory/techniques.py)."""
        return self.config.precision == Precision.BF16_PURE

    @property
    def uses_techniques(self) -> bool:
        """bf16-pure, the optimizer step in backward or the chunked loss (memory/technique_rules.py)."""
        return self.pure_bf16 or self.config.optimizer_in_backward or self.config.chunked_loss

    @property
    def half_weights(self) -> bool:
        """The weights the step computes with are 16-bit (mixed or pure)."""
        return self.mixed_precision or self.pure_bf16

    @property
    def nodes(self) -> int:
        """Nodes spanned (ceil of world size / GPUs per node)."""
        return -(-self.world_size // self.gpus_per_node)

    @property
    def samples_per_gpu_step(self) -> int:
        """Samples each GPU processes per optimizer step."""
        return self.config.global_batch(1)

    def with_config(self, **changes: object) -> Strategy:
        """This strategy with some configuration fields changed (`micro_batch_size=2`)."""
        return replace(self, config=self.config.model_copy(update=changes))


# What `auto` means when one configuration is estimated rather than planned (`memfit estimate`):
# the common setup -- DDP, bf16, no memory savers -- and each engine's usual sharding.
DEFAULT_STAGE = {Engine.DDP: 0, Engine.FSDP: 3, Engine.DEEPSPEED: 2}


def strategy_from_pins(pins: StrategySpec, *, optimizer: OptimizerKind, world_size: int = 1,
                       gpus_per_node: int | None = None, global_batch_size: int | None = None,
                       accumulation_steps: int | None = None, device: Device = Device.CUDA) -> Strategy:
    """One concrete Strategy from a job's strategy fields, `auto` read as the usual setup: DDP (ZeRO-2
    for DeepSpeed, full shard for FSDP), bf16, no checkpointing, no offload, a 32-bit optimizer,
    micro-batch 1, the accumulation that keeps `global_batch_size` (1 without one), and a full
    fine-tune unless LoRA/QLoRA is pinned, the optimizer's default implementation for the device. Not checked: `strategy_problem` says whether it can run."""
    engine = Engine.DDP if pins.engine == Engine.AUTO else pins.engine
    micro = pins.micro_batch_size if isinstance(pins.micro_batch_size, int) else 1
    if accumulation_steps is None:
        # The rule's split where it divides; otherwise the nearest split below (an estimate, not a plan).
        exact = accumulation_steps_for(global_batch_size, world_size=world_size, micro_batch_size=micro) \
            if global_batch_size else None
        accumulation_steps = exact or (max(1, global_batch_size // (world_size * micro)) if global_batch_size else 1)
    config = TrainingConfig.model_construct(
        engine=engine,
        zero_stage=DEFAULT_STAGE[engine] if pins.zero_stage == "auto" else int(pins.zero_stage),
        precision=Precision.BF16 if pins.precision == Precision.AUTO else pins.precision,
        activation_checkpointing=(Checkpointing.NONE if pins.activation_checkpointing == Checkpointing.AUTO
                                  else pins.activation_checkpointing),
        offload=Offload.NONE if pins.offload == Offload.AUTO else pins.offload,
        optimizer8bit=pins.optimizer8bit == Toggle.ENABLED,
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation_steps,
        # A pinned LoRA/QLoRA is the job's; `auto` reads as the full fine-tune (the caller adds the
        # adapter layout, which needs the problem).
        peft=pins.peft.method if pins.peft.method in (PeftMethod.LORA, PeftMethod.QLORA) else PeftMethod.NONE,
        optimizer_in_backward=pins.optimizer_in_backward == Toggle.ENABLED,
        chunked_loss=pins.chunked_loss == Toggle.ENABLED,
        activation_offload=pins.activation_offload == Toggle.ENABLED,
        # auto: the library's default for the device (temporaries.implementation), as a job without memfit.
        optimizer_implementation=(None if pins.optimizer_implementation == OptimizerImplementation.AUTO
                                  else pins.optimizer_implementation),
    )
    return Strategy(config=config, optimizer=optimizer, world_size=world_size,
                    gpus_per_node=gpus_per_node or min(world_size, 8), device=device)


def strategy_problem(strategy: Strategy) -> str | None:
    """Why this combination cannot run (None when it can). Pure checks, no shape needed."""
    config = strategy.config
    engine, stage, offload = config.engine, config.zero_stage, config.offload
    if engine not in (Engine.DDP, Engine.FSDP, Engine.DEEPSPEED):
        return f"engine must be ddp, fsdp or deepspeed, got {engine.value}"
    if config.precision == Precision.AUTO or config.activation_checkpointing == Checkpointing.AUTO:
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
    if config.optimizer8bit and offload != Offload.NONE:
        # Offloaded optimizers step on the CPU (DeepSpeedCPUAdam, torch on CPU); bitsandbytes is CUDA-only.
        return "an 8-bit (bitsandbytes) optimizer cannot run with optimizer offload"
    problem = peft_engine_problem(config.peft, engine=engine, zero_stage=stage, offload=offload)
    if problem is not None:
        return problem
    problem = technique_problem(strategy)
    if problem is not None:
        return problem
    if min(strategy.world_size, strategy.gpus_per_node, config.micro_batch_size,
           config.gradient_accumulation_steps) < 1:
        return "world size, GPUs per node, micro-batch and accumulation must be >= 1"
    return None


"""TrainingConfig: the one definition of a concrete training configuration (no `auto` left).

Engine, ZeRO stage / FSDP sharding, precision, activation checkpointing, offload, 8-bit optimizer and
the batch split. The Plan (operator -> trainer) and the status PlanSummary embed it inline (its fields
sit flat on the wire, like a Go struct embedded with `json:",inline"`); the memory model's Strategy
holds one. Its words (`describe`) and its identity without the batch split (`key`) are defined here
and nowhere else.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from memfit.api.common import (
    ApiModel,
    Checkpointing,
    Engine,
    Offload,
    OptimizerImplementation,
    PeftMethod,
    Precision,
)

ConfigKey = tuple[Engine, int, Precision, Checkpointing, Offload, bool, PeftMethod, bool, bool,
                  OptimizerImplementation | None, bool]

_OFFLOAD_WORDS = {Offload.CPU: "CPU offload", Offload.NVME: "NVMe offload"}
_PEFT_WORDS = {PeftMethod.LORA: "LoRA", PeftMethod.QLORA: "QLoRA"}


def global_batch(*, micro_batch_size: int, accumulation_steps: int, world_size: int) -> int:
    """THE global-batch rule: samples per optimizer step = micro-batch x accumulation x data-parallel
    ranks. Every split a plan makes keeps `training.globalBatchSize` by it."""
    return micro_batch_size * accumulation_steps * world_size


def samples_per_gpu(global_batch_size: int, world_size: int) -> int | None:
    """Samples each rank processes per optimizer step (micro-batch x accumulation), or None when the
    global batch does not split evenly over `world_size` ranks."""
    per_gpu, left = divmod(global_batch_size, world_size)
    return per_gpu if left == 0 and per_gpu > 0 else None


def accumulation_steps(global_batch_size: int, *, world_size: int, micro_batch_size: int) -> int | None:
    """The accumulation that keeps the global batch at this micro-batch, or None when none does."""
    per_gpu = samples_per_gpu(global_batch_size, world_size)
    if per_gpu is None or per_gpu % micro_batch_size:
        return None
    return per_gpu // micro_batch_size


def optimizer_implementation_problem(*, precision: Precision, offload: Offload, optimizer8bit: bool) -> str | None:
    """Why `optimizerImplementation` cannot be chosen for this optimizer (None when it can): it picks how
    torch's (and DeepSpeed's GPU) Adam/AdamW/SGD step; bitsandbytes' 8-bit step, bf16-pure's stochastic
    rounding and an offloaded optimizer (DeepSpeedCPUAdam, the host's torch step) run their own kernels."""
    if optimizer8bit:
        return "optimizer8bit is enabled (bitsandbytes steps with its own kernels)"
    if precision == Precision.BF16_PURE:
        return "precision is bf16-pure (memfit's stochastically rounded step loops over slices of each tensor)"
    if offload in (Offload.CPU, Offload.NVME):
        return f"offload is {offload.value} (the offloaded optimizer steps on the host with its own kernels)"
    return None


class TrainingConfig(ApiModel):
    """How one training run is configured: engine and sharding, precision, memory savers, batch split.

    `zero_stage` is the DeepSpeed ZeRO stage; for FSDP 2 means SHARD_GRAD_OP (parameters stay gathered
    between forward and backward) and 3 FULL_SHARD; DDP is stage 0. Offload `cpu` moves the optimizer
    state (and at stage 3 also the parameters) to host RAM; `nvme` (DeepSpeed ZeRO-3, ZeRO-Infinity)
    moves both to local NVMe.
    """

    engine: Engine
    zero_stage: int = Field(ge=0, le=3)
    precision: Precision
    activation_checkpointing: Checkpointing
    offload: Offload
    optimizer8bit: bool
    micro_batch_size: int = Field(ge=1)
    gradient_accumulation_steps: int = Field(ge=1)
    peft: PeftMethod = Field(
        default=PeftMethod.NONE,
        description="none (full fine-tune), lora (adapters on a frozen 16-bit base) or qlora (on a 4-bit base).",
    )
    optimizer_in_backward: bool = Field(
        default=False, description="Each parameter steps in its post-accumulate-grad hook; no gradient is kept.",
    )
    chunked_loss: bool = Field(
        default=False, description="Head and cross-entropy over chunks of tokens, recomputed in backward.",
    )
    activation_offload: bool = Field(
        default=False, description="Each block's saved activations kept in host memory between forward and backward.",
    )
    optimizer_implementation: OptimizerImplementation | None = Field(
        default=None,
        description="fused, foreach or for-loop: how the 32-bit torch optimizer steps. Unset: the library's "
        "default (torch: foreach on CUDA, the per-tensor loop on a CPU; DeepSpeed: FusedAdam on CUDA), and "
        "always for 8-bit, bf16-pure and offloaded optimizers, which have their own kernels.",
    )

    @field_validator("optimizer_implementation")
    @classmethod
    def _concrete_implementation(cls, value: OptimizerImplementation | None) -> OptimizerImplementation | None:
        if value == OptimizerImplementation.AUTO:
            raise ValueError("optimizerImplementation must be fused, foreach or for-loop in a concrete "
                             "configuration (or unset), not auto")
        return value

    def global_batch(self, world_size: int) -> int:
        """The global batch this split gives on `world_size` data-parallel ranks (`global_batch`)."""
        return global_batch(micro_batch_size=self.micro_batch_size, accumulation_steps=self.gradient_accumulation_steps,
                            world_size=world_size)

    def training_config(self) -> TrainingConfig:
        """The bare configuration (a Plan or PlanSummary embeds one; this drops their other fields)."""
        if type(self) is TrainingConfig:
            return self
        return TrainingConfig.model_validate({name: getattr(self, name) for name in TrainingConfig.model_fields})

    def key(self) -> ConfigKey:
        """The configuration without its batch split: what two runs must share for the memory of one to
        speak for the other (measured peaks, caches)."""
        return (self.engine, self.zero_stage, self.precision, self.activation_checkpointing, self.offload,
                self.optimizer8bit, self.peft, self.optimizer_in_backward, self.chunked_loss,
                self.optimizer_implementation, self.activation_offload)

    def describe(self, *, words: bool = False, batch: bool = True) -> str:
        """`ZeRO-2 bf16 ckpt-full offload-cpu 8-bit-optim mbs 2x4`; with `words`, for sentences:
        `ZeRO-2, bf16, full checkpointing, CPU offload, 8-bit optimizer` (never the batch split); a LoRA or
        QLoRA configuration starts with `LoRA` / `QLoRA`."""
        if self.engine == Engine.DEEPSPEED:
            sharding = f"ZeRO-{self.zero_stage}"
        elif self.engine == Engine.FSDP:
            full = self.zero_stage == 3
            sharding = ("FSDP full shard" if full else "FSDP grad-op shard") if words else (
                "FSDP-full-shard" if full else "FSDP-grad-op")
        else:
            sharding = "DDP"
        parts = [sharding, self.precision.value]
        if self.peft in _PEFT_WORDS:
            parts.insert(0, _PEFT_WORDS[self.peft])
        ckpt = self.activation_checkpointing
        if ckpt != Checkpointing.NONE:
            parts.append(f"{ckpt.value} checkpointing" if words else f"ckpt-{ckpt.value}")
        if self.offload != Offload.NONE:
            parts.append(_OFFLOAD_WORDS.get(self.offload, self.offload.value) if words else f"offload-{self.offload.value}")
        if self.optimizer8bit:
            parts.append("8-bit optimizer" if words else "8-bit-optim")
        if self.optimizer_in_backward:
            parts.append("optimizer step in backward" if words else "optim-in-bwd")
        if self.chunked_loss:
            parts.append("chunked loss" if words else "chunked-loss")
        if self.activation_offload:
            parts.append("activation offload" if words else "act-offload")
        implementation = self.optimizer_implementation
        if implementation in (OptimizerImplementation.FOREACH, OptimizerImplementation.FOR_LOOP):
            # fused is what the planner picks wherever it applies: only the slower choices are named.
            assert implementation is not None
            parts.append(f"{implementation.value} optimizer" if words else f"optim-{implementation.value}")
        if words:
            return ", ".join(parts)
        if batch:
            parts.append(f"mbs {self.micro_batch_size}x{self.gradient_accumulation_steps}")
        return " ".join(parts)


# fp32 DDP, nothing saved, one sample per step: what a job runs without memfit (and the default Strategy).
PLAIN_FP32_DDP = TrainingConfig(
    engine=Engine.DDP, zero_stage=0, precision=Precision.FP32, activation_checkpointing=Checkpointing.NONE,
    offload=Offload.NONE, optimizer8bit=False, micro_batch_size=1, gradient_accumulation_steps=1,
)

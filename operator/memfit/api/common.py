"""Shared API building blocks: the base model, str enums and Kubernetes-shaped sub-objects."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_GROUP = "memfit.dev"
API_VERSION = "v1alpha1"
API_GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"

# Bounds applied to every free-form string and list, so CEL cost estimation passes (Kueue, Trainer).
NAME_MAX = 63
TEXT_MAX = 1024
IMAGE_MAX = 512
LIST_MAX = 32

DNSLabel = Annotated[
    str, Field(min_length=1, max_length=NAME_MAX, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


def wire_name(field: str) -> str:
    """snake_case -> camelCase, keeping `8bit` lower case (`optimizer8bit`)."""
    return to_camel(field).replace("8Bit", "8bit")


class ApiModel(BaseModel):
    """Frozen, camelCase on the wire, unknown fields rejected (reported, never silently dropped)."""

    model_config = ConfigDict(
        alias_generator=wire_name,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
        validate_default=True,
    )

    def to_wire(self) -> dict[str, object]:
        """Serialise as the API server stores it: camelCase, no None fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Engine(StrEnum):
    """Distributed training engine."""

    AUTO = "auto"
    DDP = "ddp"
    FSDP = "fsdp"
    DEEPSPEED = "deepspeed"


class Precision(StrEnum):
    """Training precision: fp32; mixed precision with bf16/fp16 compute over fp32 weights (autocast, or a
    DeepSpeed fp32 master copy); or bf16-pure: bf16 weights, gradients and optimizer state with no fp32
    copy, the update stochastically rounded (docs/techniques.md)."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    BF16_PURE = "bf16-pure"


class Checkpointing(StrEnum):
    """Activation checkpointing: none, selective (attention recomputed), selective-op (every block under a
    per-op policy: matmul and attention outputs saved, the rest recomputed) or full (every block)."""

    AUTO = "auto"
    NONE = "none"
    SELECTIVE = "selective"
    SELECTIVE_OP = "selective-op"
    FULL = "full"


class Offload(StrEnum):
    """Where optimizer state (and, at ZeRO-3, parameters) is offloaded."""

    AUTO = "auto"
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class PeftMethod(StrEnum):
    """Parameter-efficient fine-tuning: none (full fine-tune), LoRA adapters on a frozen 16-bit base,
    QLoRA adapters on a frozen 4-bit base; `auto` lets the planner choose among `peft.allowed`."""

    AUTO = "auto"
    NONE = "none"
    LORA = "lora"
    QLORA = "qlora"


class QuantType(StrEnum):
    """bitsandbytes 4-bit data type of a QLoRA base: NormalFloat4 (Dettmers et al. 2023) or FP4."""

    NF4 = "nf4"
    FP4 = "fp4"


class Toggle(StrEnum):
    """A choice the planner makes unless the user pins it."""

    AUTO = "auto"
    ENABLED = "enabled"
    DISABLED = "disabled"


class OptimizerImplementation(StrEnum):
    """How a 32-bit torch optimizer's step runs (torch.optim `fused=` / `foreach=`): one fused kernel per
    tensor group, updating in place; `foreach` ops over the whole tensor list (one fp32 temporary the size
    of the list); or a loop over the tensors (temporaries of one or two tensors, one launch per op and
    tensor). `auto` lets the planner choose."""

    AUTO = "auto"
    FUSED = "fused"
    FOREACH = "foreach"
    FOR_LOOP = "for-loop"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """metav1.Condition."""

    type: str = Field(max_length=316, description="Condition type in CamelCase, e.g. Planned.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(default=None, ge=0, description="Generation it was set for.")
    last_transition_time: datetime | None = Field(default=None, description="When the status last changed.")
    reason: str = Field(max_length=1024, description="CamelCase reason, e.g. NoFit.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")


class Toleration(ApiModel):
    """core/v1 Toleration."""

    key: str | None = Field(default=None, max_length=316, description="Taint key; empty matches all.")
    operator: str | None = Field(
        default=None, pattern=r"^(Exists|Equal)$", max_length=16, description="Exists or Equal."
    )
    value: str | None = Field(default=None, max_length=NAME_MAX, description="Taint value for Equal.")
    effect: str | None = Field(
        default=None,
        pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$",
        max_length=32,
        description="NoSchedule, PreferNoSchedule or NoExecute; empty matches all.",
    )
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long to stay.")

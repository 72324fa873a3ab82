"""Profile: what the profiling pod measured about a problem (profiler -> operator contract, <= 4 KiB JSON)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memfit.api.common import ApiModel, Checkpointing, PeftMethod, Precision

PROFILE_SCHEMA = "memfit.dev/profile/v1"


class ModelShape(ApiModel):
    """The analytic shape of the model (enough for the memory and time model)."""

    family: Literal["decoder", "encoder", "encoder-decoder", "vision"] = "decoder"
    parameters: int = Field(ge=0, description="All parameters.")
    trainable_parameters: int | None = Field(default=None, ge=0, description="Trainable; default all.")
    largest_layer_parameters: int = Field(ge=0, description="Largest single module's parameters (L_max).")
    buffer_bytes: int = Field(default=0, ge=0, description="Non-parameter buffers in the model.")
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int | None = Field(
        default=None, ge=1, description="Key/value heads (grouped-query attention); default = heads."
    )
    ffn_hidden: int = Field(ge=1)
    vocab: int = Field(default=0, ge=0, description="Output vocabulary (0 for a classifier head).")
    tokens_per_sample: int = Field(ge=1, description="Sequence positions per sample.")
    gated_mlp: bool = Field(default=False, description="SwiGLU-style MLP with three matrices.")
    flash_attention: bool = Field(default=True, description="Attention scores not materialised (SDPA).")
    dropout: bool = Field(default=False, description="Dropout active in training (masks are stored).")
    separate_qkv: bool = Field(
        default=False, description="Q, K, V (and gate/up) are separate Linear layers, not one fused matmul."
    )
    small_parameters: int | None = Field(
        default=None, ge=0,
        description="Trainable parameters in tensors under 4096 elements (32-bit state under 8-bit optimizers), "
        "counted on the built model; default: estimated from the dimensions.",
    )

    @property
    def trainable(self) -> int:
        return self.parameters if self.trainable_parameters is None else self.trainable_parameters


class Measurement(ApiModel):
    """One measured training configuration (single process, no sharding)."""

    precision: Precision
    checkpointing: Checkpointing
    micro_batch_size: int = Field(ge=1)
    optimizer8bit: bool = False
    peak_allocated_bytes: int = Field(ge=0)
    peak_reserved_bytes: int | None = Field(default=None, ge=0)
    peak_backward_bytes: int | None = Field(default=None, ge=0, description="Peak of forward + backward.")
    peak_step_bytes: int | None = Field(default=None, ge=0, description="Peak of the optimizer step.")
    step_seconds: float = Field(ge=0)
    peft: PeftMethod | None = Field(
        default=None,
        description="lora or qlora: measured with the job's adapters (the PEFT variant); absent: full fine-tune.",
    )
    blocks: int | None = Field(
        default=None, ge=1, description="Repeated blocks of the measured model (depth-reduced profiles); "
        "default: the full model.",
    )


class ActivationCurve(ApiModel):
    """Forward+backward peaks above the bytes allocated at the step's start, at several micro-batches.

    Measured for one (precision, checkpointing) on the model as the trainer runs it: `gradientsHeld`
    false is the bare model (world size 1: backward creates the gradients), true the model under DDP
    with `gradient_as_bucket_view` (world size 2+, or accumulation: the gradients exist before forward
    and are part of the start). `savedBytesPerSample` is what autograd saves for backward per sample
    (saved-tensor hooks, unique storages): a cross-check of the fitted slope.
    """

    precision: Precision
    checkpointing: Checkpointing
    gradients_held: bool = False
    micro_batch_sizes: list[int] = Field(max_length=8)
    peak_bytes: list[int] = Field(max_length=8, description="Peak minus start-of-step allocated bytes.")
    saved_bytes_per_sample: int | None = Field(default=None, ge=0)
    blocks: int | None = Field(default=None, ge=1, description="Repeated blocks measured; default: all.")


class ReducedDepth(ApiModel):
    """What was counted on one depth-reduced model (the same architecture with fewer blocks)."""

    blocks: int = Field(ge=1)
    parameters: int = Field(ge=0)
    trainable_parameters: int | None = Field(default=None, ge=0)
    small_parameters: int = Field(default=0, ge=0)
    buffer_bytes: int = Field(default=0, ge=0)
    flops_per_sample: float = Field(default=0.0, ge=0)


class DepthProfile(ApiModel):
    """A depth-reduced profile: the full model has `layers` repeated blocks, the measurements were taken
    on models with only `reduced[*].blocks` of them; the predictor scales per-block terms to `layers`."""

    layers: int = Field(ge=1, description="Repeated blocks of the full model (counted on the meta device).")
    reduced: list[ReducedDepth] = Field(min_length=2, max_length=4)


class SkippedRun(ApiModel):
    """A configuration or activation curve the profiling device could not run (not out of memory: a kernel
    without that precision, a library that refuses it). The rest of the profile stands; on a GPU of this
    profile's product the planner never picks the refused precision and checkpointing."""

    kind: Literal["configuration", "curve"]
    precision: Precision
    checkpointing: Checkpointing
    micro_batch_size: int | None = Field(default=None, ge=1)
    reason: str = Field(max_length=160, description="The error the step raised, shortened.")


class Profile(ApiModel):
    """A problem's measured memory and compute, from one short profiling run."""

    schema_version: Literal["memfit.dev/profile/v1"] = "memfit.dev/profile/v1"
    problem_hash: str = Field(max_length=64)
    device: str = Field(default="cpu", max_length=64, description="cpu or cuda:<product>.")
    shape: ModelShape | None = None
    flops_per_sample: float = Field(default=0.0, ge=0, description="Training FLOPs per sample (fwd+bwd).")
    achieved_tflops: float | None = Field(default=None, ge=0, description="Measured on the profiling device.")
    mfu: float | None = Field(default=None, ge=0, le=1, description="Model FLOPs utilisation measured.")
    measurements: list[Measurement] = Field(default_factory=list, max_length=32)
    activation_curves: list[ActivationCurve] = Field(
        default_factory=list, max_length=16,
        description="Per-sample activation terms measured directly (user models without an analytic form).",
    )
    optimizer: str | None = Field(default=None, max_length=16, description="The optimizer the steps ran with.")
    compute: Literal["full", "elided", "analytic"] | None = Field(
        default=None, description="Real arithmetic, elided (shape-exact) steps, or nothing measured (analytic: "
        "the shape only; the plan gets a larger headroom)."
    )
    compute_reason: str | None = Field(
        default=None, max_length=256,
        description="Why the profiler fell back to real arithmetic, or measured nothing (analytic).",
    )
    unused_parameters: bool = Field(
        default=False, description="Trainable parameters got no gradient: DDP needs find_unused_parameters."
    )
    depth: DepthProfile | None = Field(
        default=None, description="Set when the model was measured with fewer blocks than it has (large models)."
    )
    skipped: list[SkippedRun] = Field(
        default_factory=list, max_length=6,
        description="What the device refused to run (skipped; the planner avoids it on this GPU product).",
    )
    seconds: float = Field(default=0.0, ge=0, description="Wall time of the profiling run.")
    error: str | None = Field(default=None, max_length=1024, description="Why profiling failed.")

    def to_json(self) -> str:
        """Compact JSON for the termination message (at most 4 KiB)."""
        return self.model_dump_json(by_alias=True, exclude_none=True)

    def refused(self) -> frozenset[tuple[Precision, Checkpointing]]:
        """(precision, checkpointing) pairs the profiling device could not run."""
        return frozenset((s.precision, s.checkpointing) for s in self.skipped)

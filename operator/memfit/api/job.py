"""MemoryOptimizedTrainingJob: spec (what the user asks) and status (what memfit observed and chose)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import Field, PlainValidator, WithJsonSchema, field_validator, model_validator

from memfit.api.common import (
    IMAGE_MAX,
    LIST_MAX,
    NAME_MAX,
    ApiModel,
    Checkpointing,
    Condition,
    DNSLabel,
    Engine,
    Offload,
    OptimizerImplementation,
    Precision,
    Toggle,
)
from memfit.api.data import DataSpec
from memfit.api.own_code import OwnContainer
from memfit.api.peft import PeftSpec
from memfit.api.pod_template import PodTemplate
from memfit.api.problem import Problem
from memfit.api.reasons import Reason
from memfit.api.rules import check_spec
from memfit.api.training_config import TrainingConfig

Auto = Literal["auto"]


def _int_or_auto(*, low: int, high: int, name: str) -> Callable[[Any], str | int]:
    def parse(value: Any) -> str | int:
        if value == "auto":
            return "auto"
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        if isinstance(value, str) and value.isdigit() and low <= int(value) <= high:
            return int(value)
        raise ValueError(f"{name} must be auto or an integer {low}..{high}; got {value!r}")

    return parse


_INT_OR_STRING = WithJsonSchema({"x-kubernetes-int-or-string": True})
ZeroStage = Annotated[
    Auto | int, PlainValidator(_int_or_auto(low=0, high=3, name="zeroStage")), _INT_OR_STRING
]
MicroBatch = Annotated[
    Auto | int, PlainValidator(_int_or_auto(low=1, high=65536, name="microBatchSize")), _INT_OR_STRING
]


class OptimizerKind(StrEnum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


# The trainer's interval when neither the job nor the plan names one (the old fixed default).
DEFAULT_CHECKPOINT_EVERY_STEPS = 500


class CheckpointSpec(ApiModel):
    """Where and how often training state is saved; a re-plan or a replaced pod resumes from the latest one.

    Durable by default: without `volumeClaim` the operator creates a PersistentVolumeClaim
    `<job>-checkpoints` per job (storage class and access mode from the chart's `checkpoints` values,
    size from the plan's model-state estimate), deleted with the job. `emptyDir: true` opts out."""

    volume_claim: str | None = Field(
        default=None, max_length=NAME_MAX,
        description="Your PersistentVolumeClaim mounted at /checkpoints (memfit neither creates nor deletes "
        "it). Empty = memfit creates `<job>-checkpoints` for the job. A plan over several nodes needs a "
        "ReadWriteMany claim; with a ReadWriteOnce one the plan stays on one node.",
    )
    empty_dir: bool = Field(
        default=False,
        description="Keep checkpoints in an emptyDir (lost with the pod: a re-plan or a replaced pod "
        "starts again at step 0). Only when asked; excludes volumeClaim.",
    )
    every_steps: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="Save every N optimizer steps (and at the last). Unset = memfit chooses per plan: on a "
        "spot pool the interval that minimises expected hours (checkpoint writes against work lost to "
        "interruptions), elsewhere 500 or more, keeping checkpoint writes within 1 % of the run.",
    )

    @model_validator(mode="after")
    def _one_volume(self) -> Self:
        if self.empty_dir and self.volume_claim:
            raise ValueError("volumeClaim and emptyDir exclude each other: name a claim or ask for an emptyDir")
        return self


class TrainingSpec(ApiModel):
    """The training run the plan must honour (the global batch is fixed; accumulation adapts)."""

    global_batch_size: int = Field(default=8, ge=1, le=1_048_576, description="Samples per optimizer step.")
    max_steps: int = Field(default=100, ge=1, le=100_000_000, description="Optimizer steps to run.")
    optimizer: OptimizerKind = Field(default=OptimizerKind.ADAMW, description="adamw, adam or sgd.")
    learning_rate: float = Field(default=3e-4, gt=0, le=10, description="Peak learning rate.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")


class StrategySpec(ApiModel):
    """Memory-saving settings; every field is chosen by the planner unless pinned."""

    engine: Engine = Field(default=Engine.AUTO, description="auto, ddp, fsdp or deepspeed.")
    precision: Precision = Field(
        default=Precision.AUTO,
        description="auto, fp32, bf16, fp16 or bf16-pure (bf16 weights, gradients and optimizer state, no "
        "fp32 master; auto considers it only with allowPureBf16).",
    )
    allow_pure_bf16: bool = Field(
        default=False,
        description="Let precision auto choose bf16-pure: it changes the numerics (no fp32 master copy; "
        "stochastically rounded updates), so it is never chosen unasked.",
    )
    optimizer_in_backward: Toggle = Field(
        default=Toggle.AUTO,
        description="auto, enabled or disabled: each parameter steps in its post-accumulate-grad hook and "
        "its gradient is freed at once (DDP on one GPU, no gradient accumulation, not fp16).",
    )
    chunked_loss: Toggle = Field(
        default=Toggle.AUTO,
        description="auto, enabled or disabled: the language-model head and cross-entropy run over chunks "
        "of tokens, recomputed in backward, so the full fp32 logits never exist (same loss value).",
    )
    activation_offload: Toggle = Field(
        default=Toggle.AUTO,
        description="auto, enabled or disabled: each transformer block's saved activations go to pinned host "
        "memory in forward and come back in backward (saved-tensor hooks), counted against the pool's host RAM "
        "and their copies against its PCIe bandwidth. Full fine-tunes on memfit's trainer, GPUs only.",
    )
    activation_checkpointing: Checkpointing = Field(
        default=Checkpointing.AUTO,
        description="auto, none, selective (each block's attention recomputed), selective-op (each block recomputed "
        "but its matmul and attention outputs kept: torch's selective activation checkpointing) or full.",
    )
    optimizer_implementation: OptimizerImplementation = Field(
        default=OptimizerImplementation.AUTO,
        description="auto, fused, foreach or for-loop: how memfit's 32-bit torch optimizer steps (fused kernels in "
        "place; foreach, one fp32 temporary of all local parameters; a per-tensor loop). auto: fused on GPUs. "
        "Not with optimizer8bit, bf16-pure or offload (they have their own kernels).",
    )
    zero_stage: ZeroStage = Field(
        default="auto",
        description="auto or a ZeRO stage 0-3 (FSDP: 2 = shard grads+optimizer, 3 = also params).",
    )
    offload: Offload = Field(default=Offload.AUTO, description="auto, none, cpu or nvme (DeepSpeed only).")
    optimizer8bit: Toggle = Field(
        default=Toggle.AUTO, description="auto, enabled or disabled: bitsandbytes 8-bit optimizer state."
    )
    micro_batch_size: MicroBatch = Field(
        default="auto",
        description="auto or samples per GPU per forward pass; must divide the global batch per GPU.",
    )
    peft: PeftSpec = Field(
        default_factory=PeftSpec,
        description="LoRA/QLoRA the planner may use: none (default, full fine-tune), lora, qlora, or auto "
        "with an allowed list. memfit never switches to a method the user did not allow.",
    )


class OutputSpec(ApiModel):
    """Where the trained result goes: a full fine-tune writes the model in Hugging Face format there
    (consolidated from ZeRO-3 / FSDP shards: config, safetensors weights, tokenizer), a LoRA/QLoRA run its
    adapter (peft's layout, and the merged model when asked); both add `memfit_training.json`, the
    training summary (steps, losses, eval losses)."""

    volume_claim: str = Field(max_length=NAME_MAX, description="PersistentVolumeClaim mounted at /output.")
    path: str = Field(
        default="", max_length=1024, pattern=r"^[A-Za-z0-9._/-]*$",
        description="Folder on the volume (relative, no `..`), e.g. out/llama-8b-ft; empty = the job's name.",
    )
    merged: bool = Field(
        default=False, description="Also write the base with the adapter merged in (LoRA/QLoRA runs)."
    )


class BaselineSpec(ApiModel):
    """What the job would run on without memfit; savings are reported against it."""

    node_pool: DNSLabel = Field(description="GPUNodePool name (or catalog GPU key offline), e.g. a100-80.")
    nodes: int = Field(default=1, ge=1, le=1024, description="Nodes the baseline uses.")


class PlacementSpec(ApiModel):
    """Where the job may run."""

    node_pools: list[DNSLabel] = Field(
        default_factory=list, max_length=LIST_MAX, description="Allowed GPUNodePools; empty = all."
    )
    max_nodes: int = Field(default=8, ge=1, le=1024, description="Most nodes one attempt may use.")
    baseline: BaselineSpec | None = Field(default=None, description="The pool the job would use otherwise.")


class Minimize(StrEnum):
    COST = "cost"
    TIME = "time"


class ObjectiveSpec(ApiModel):
    """What the planner optimises and the limits it respects."""

    minimize: Minimize = Field(default=Minimize.COST, description="cost (total $) or time (wall clock).")
    max_cost_per_hour: float | None = Field(default=None, ge=0, le=1e6, description="Upper bound on $/h.")
    deadline_hours: float | None = Field(default=None, gt=0, le=1e5, description="Upper bound on run hours.")
    memory_headroom_percent: int = Field(
        default=10, ge=0, le=90, description="Predicted peak x (1 + headroom) must fit usable GPU memory."
    )


class ProfilingDepth(StrEnum):
    AUTO = "auto"
    FULL = "full"
    REDUCED = "reduced"


class ProfilingSpec(ApiModel):
    """The short profiling run that measures the job's memory."""

    node_pool: str = Field(default="auto", max_length=NAME_MAX, description="auto or a GPUNodePool name.")
    timeout_seconds: int = Field(default=600, ge=30, le=86400, description="Deadline of the profiling Job.")
    reuse: bool = Field(default=True, description="Reuse a cached profile of the same problem.")
    depth: ProfilingDepth = Field(
        default=ProfilingDepth.AUTO,
        description="full: profile the whole model; reduced: build the full model on the meta device and "
        "measure 1 and 2 of its repeated blocks (entrypoints need a `depth` argument); auto: reduced when "
        "the model's analytic size does not fit the profiling GPU (full for models without one).",
    )


class RecoverySpec(ApiModel):
    """Re-planning on OOM or missing capacity, and restarting a multi-node gang after a rank failure."""

    max_replans: int = Field(default=3, ge=0, le=20, description="Re-plans before the job fails.")
    max_restarts: int = Field(
        default=3, ge=0, le=20,
        description="Whole-gang restarts of a multi-node plan before the job fails: when a rank fails (not "
        "for memory), every rank stops and the next attempt resumes all of them from the last checkpoint.",
    )
    capacity_timeout_seconds: int = Field(
        default=600, ge=10, le=86400, description="Unschedulable this long -> re-plan without that pool."
    )


_QUEUE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class SchedulingSpec(ApiModel):
    """Queue and priority. Gang admission comes from Kueue (a multi-node plan is one Workload)."""

    kueue_queue: str = Field(
        default="", max_length=NAME_MAX, description="Kueue LocalQueue; the Job is suspended for Kueue."
    )

    @field_validator("kueue_queue")
    @classmethod
    def _queue_is_a_local_queue_name(cls, queue: str) -> str:
        """A LocalQueue of the job's own namespace, by name: it becomes the children's
        `kueue.x-k8s.io/queue-name` label (a `namespace/name` would be refused by the API server)."""
        if queue and not _QUEUE_NAME.fullmatch(queue):
            where = (" (LocalQueues are namespaced: a job can only use one of its own namespace; create the "
                     "LocalQueue there, pointing at the ClusterQueue)" if "/" in queue else "")
            raise ValueError(f"kueueQueue must be the name of a LocalQueue in the job's namespace (lower-case "
                             f"letters, digits, '-' and '.'); got {queue!r}{where}")
        return queue
    priority_class_name: str = Field(default="", max_length=253, description="PriorityClass of the pods.")


class MemoryOptimizedTrainingJobSpec(ApiModel):
    """A training job memfit fits in memory at the lowest cost."""

    image: str = Field(
        default="", max_length=IMAGE_MAX, description="Trainer image; empty = operator default."
    )
    problem: Problem = Field(description="What to train: exactly one of builtin, huggingface, entrypoint.")
    data: DataSpec | None = Field(
        default=None,
        description="Training data: a hub dataset, files on a volume, or synthetic: true; absent = synthetic.",
    )
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Batch, steps, optimizer.")
    output: OutputSpec | None = Field(
        default=None, description="Where the trained model (or adapter) and the training summary go.")
    strategy: StrategySpec = Field(default_factory=StrategySpec, description="Pinned or auto settings.")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="Pools and node limits.")
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec, description="Cost or time, limits.")
    profiling: ProfilingSpec = Field(default_factory=ProfilingSpec, description="Profiling run.")
    recovery: RecoverySpec = Field(default_factory=RecoverySpec, description="Re-planning bounds.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Gang scheduling.")
    container: OwnContainer | None = Field(
        default=None,
        description="Your own training container (image, command, args, env, workingDir) instead of memfit's "
        "trainer; `honors` lists the knobs the script applies. The problem still describes the model for "
        "planning. docs/own-code.md.",
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description="What memfit adds to every pod of the job: labels, annotations, env, envFrom, volumes and "
        "mounts, serviceAccountName, imagePullSecrets, tolerations, nodeSelector terms, initContainers and "
        "sidecars. Fields memfit owns are refused, naming the field.",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        findings = check_spec(self.to_wire())
        if findings:
            raise ValueError("; ".join(f"{path}: {message}" for path, message in findings))
        return self


class Phase(StrEnum):
    PENDING = "Pending"
    PROFILING = "Profiling"
    PLANNING = "Planning"
    LAUNCHING = "Launching"
    RUNNING = "Running"
    REPLANNING = "Replanning"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class AttemptOutcome(StrEnum):
    """How an attempt (one training Job) ended, or that it is still going."""

    LAUNCHING = "Launching"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    # The re-plan outcomes are the reasons of the same name (api.reasons): one word, one meaning.
    OUT_OF_MEMORY = Reason.OUT_OF_MEMORY.value
    MEMORY_OVER_PLAN = Reason.MEMORY_OVER_PLAN.value  # the first steps measured more than predicted + headroom
    NO_CAPACITY = Reason.NO_CAPACITY.value
    # A rank of a multi-node plan failed: the attempt's pods ended together and the next attempt restarts
    # every rank from the last checkpoint (recovery.maxRestarts).
    RANK_FAILED = Reason.RANK_FAILED.value
    # A rank of a multi-node plan was disrupted (node drained, lost, pre-empted): re-planned onto the
    # capacity left, possibly fewer nodes, every rank resuming from the checkpoint (recovery.maxReplans).
    RANK_DISRUPTED = Reason.RANK_DISRUPTED.value
    FAILED = "Failed"

    @property
    def active(self) -> bool:
        """The training Job is (still) supposed to run: the reconcile monitors it."""
        return self in (AttemptOutcome.LAUNCHING, AttemptOutcome.RUNNING)

    @property
    def replans(self) -> bool:
        """The attempt ended in a way the next reconcile re-plans (a new attempt)."""
        return self in (AttemptOutcome.OUT_OF_MEMORY, AttemptOutcome.MEMORY_OVER_PLAN, AttemptOutcome.NO_CAPACITY,
                        AttemptOutcome.RANK_FAILED, AttemptOutcome.RANK_DISRUPTED)


class ProfileSummary(ApiModel):
    """Which profile the plan used."""

    problem_hash: str = Field(max_length=64, description="Hash of the problem the profile belongs to.")
    source: str = Field(max_length=32, description="measured, cached or analytic.")
    config_map: str | None = Field(default=None, max_length=253, description="ConfigMap holding it.")
    parameters: int | None = Field(default=None, ge=0, description="Parameter count.")


class PlanSummary(TrainingConfig):  # the TrainingConfig inline: its fields sit flat in status.plan
    """The chosen configuration, as shown by kubectl get/describe."""

    node_pool: str = Field(max_length=NAME_MAX)
    nodes: int = Field(ge=1)
    gpus: int = Field(ge=1)
    gpu_product: str = Field(max_length=128)
    predicted_peak_bytes: int = Field(ge=0)
    predicted_peak: str = Field(max_length=32, description="Human-readable predicted peak, e.g. 21.3Gi.")
    gpu_memory_bytes: int = Field(ge=0)
    cost_per_hour: float = Field(ge=0)
    cost_per_hour_text: str = Field(max_length=32, description="e.g. $3.20.")
    estimated_hours: float = Field(ge=0)
    estimated_cost: float = Field(ge=0)
    baseline: str | None = Field(
        default=None, max_length=256,
        description="The default baseline: a practitioner without a planner, with the job's pins (the 20 B/param "
        "rule picks the cheapest GPU that holds the model, then plain DDP, checkpointing, a bigger GPU, FSDP on "
        "whole nodes, more nodes, CPU offload until it fits).",
    )
    baseline_cost_per_hour: float | None = Field(default=None, ge=0)
    baseline_cost: float | None = Field(default=None, ge=0)
    savings_percent: float | None = Field(
        default=None, description="100 x (1 - estimatedCost / baselineCost); negative when the plan costs more."
    )
    savings: str | None = Field(default=None, max_length=24, description="e.g. saves 78%, or costs 5% more.")
    wall_clock_ratio: float | None = Field(
        default=None, ge=0, description="estimatedHours / the baseline's hours, shown beside the savings: a "
        "cheaper plan may take longer.")
    declared_baseline: str | None = Field(
        default=None, max_length=256, description="The plain setup on placement.baseline, reported beside."
    )
    declared_baseline_cost: float | None = Field(default=None, ge=0)
    declared_savings_percent: float | None = Field(default=None)
    cost_note: str | None = Field(
        default=None, max_length=1024,
        description="Why it costs what it does: the part of a shared node it uses, spot interruptions priced "
        "as risk, or why on-demand was chosen over spot.",
    )


class Attempt(ApiModel):
    """One launch of the training Job."""

    index: int = Field(ge=0)
    node_pool: str = Field(max_length=NAME_MAX)
    nodes: int = Field(ge=1)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: AttemptOutcome = Field(
        description="Launching, Running, Succeeded, OutOfMemory, NoCapacity or Failed."
    )
    measured_peak_bytes: int | None = Field(default=None, ge=0)
    predicted_peak_bytes: int | None = Field(default=None, ge=0)
    reason: str = Field(default="", max_length=1024)
    gpus: int | None = Field(default=None, ge=1, description="GPUs the attempt rented.")
    price_per_hour: float | None = Field(default=None, ge=0, description="$/h of the attempt's nodes.")
    quota_checked_at: datetime | None = Field(
        default=None,
        description="When memfit last looked for another pool's Kueue quota for this queued attempt "
        "(after capacityTimeoutSeconds, at most every 30 s).",
    )
    capacity_wait_since: datetime | None = Field(
        default=None,
        description="When the attempt's pods, having waited for their PersistentVolumeClaims, became "
        "unschedulable for want of capacity: capacityTimeoutSeconds counts from here, not from the claim wait.",
    )


class SpendItem(ApiModel):
    """What one profiling run or training attempt cost: its GPU-hours at its pool's price."""

    kind: Literal["profiling", "training"]
    attempt: int | None = Field(default=None, ge=0, description="Training attempt index.")
    node_pool: str = Field(max_length=NAME_MAX)
    outcome: str = Field(max_length=32, description="Succeeded, OutOfMemory, NoCapacity, Failed, Profiled...")
    gpus: int = Field(ge=0)
    seconds: float = Field(ge=0, description="Wall time from start to finish.")
    gpu_hours: float = Field(ge=0)
    price_per_hour: float = Field(ge=0)
    cost: float = Field(ge=0, description="$: hours x price per hour.")


class Spend(ApiModel):
    """Actual spend so far: every finished profiling run and attempt, failed ones included."""

    items: list[SpendItem] = Field(default_factory=list, max_length=34)
    gpu_hours: float = Field(default=0, ge=0)
    total: float = Field(default=0, ge=0, description="$ spent on finished runs.")
    predicted: float | None = Field(default=None, ge=0, description="$ the current plan was estimated to cost.")


class Progress(ApiModel):
    """Training progress read from rank 0's metrics endpoint (the trainer never writes to the API server)."""

    step: int = Field(ge=0, description="Last completed optimizer step.")
    max_steps: int = Field(ge=1, description="training.maxSteps.")
    steps: str = Field(max_length=32, description="step/maxSteps, e.g. 120/1000 (the Step column).")
    loss: float | None = Field(default=None, description="Training loss of the last step.")
    eval_loss: float | None = Field(default=None, description="Last evaluation loss, when the trainer reports one.")
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Tokens per second of the whole job (rank 0's rate x data-parallel ranks)."
    )
    step_seconds: float | None = Field(default=None, ge=0, description="Mean optimizer step time of the pod.")
    eta_seconds: int | None = Field(default=None, ge=0, description="Seconds to maxSteps at the mean step time.")
    eta: str | None = Field(default=None, max_length=16, description="eta_seconds for people, e.g. 1h05m.")
    resumed_from_step: int | None = Field(
        default=None, ge=0,
        description="The checkpoint step the running pod resumed from (after a re-plan or a replaced pod).",
    )
    attempt: int = Field(ge=0, description="The attempt the numbers come from.")
    pod: str | None = Field(
        default=None, max_length=253, description="The rank-0 pod the numbers come from (a new one after a replacement)."
    )
    updated_at: datetime = Field(description="When the operator read them.")


class MemoryOptimizedTrainingJobStatus(ApiModel):
    """Observed state; written only by the operator."""

    observed_generation: int | None = Field(default=None, ge=0)
    phase: Phase = Field(default=Phase.PENDING)
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    profile: ProfileSummary | None = None
    plan: PlanSummary | None = None
    attempts: list[Attempt] = Field(default_factory=list, max_length=32)
    measured_peak_bytes: int | None = Field(default=None, ge=0)
    spend: Spend | None = Field(default=None, description="GPU-hours x price of every finished run.")
    progress: Progress | None = Field(default=None, description="Step, loss, throughput and ETA while training.")
    checkpoint_claim: str | None = Field(
        default=None, max_length=NAME_MAX,
        description="The PersistentVolumeClaim holding the checkpoints (none: emptyDir, asked for).",
    )
    message: str = Field(default="", max_length=4096, description="Last decision in one line.")


class ObjectMeta(ApiModel):
    """The part of metav1.ObjectMeta memfit reads."""

    model_config = ApiModel.model_config | {"extra": "ignore"}

    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(default=None, max_length=NAME_MAX)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    uid: str | None = None


class MemoryOptimizedTrainingJob(ApiModel):
    """The MOTJ resource as a whole."""

    api_version: Literal["memfit.dev/v1alpha1"] = Field(default="memfit.dev/v1alpha1", alias="apiVersion")
    kind: Literal["MemoryOptimizedTrainingJob"] = "MemoryOptimizedTrainingJob"
    metadata: ObjectMeta
    spec: MemoryOptimizedTrainingJobSpec
    status: MemoryOptimizedTrainingJobStatus | None = None

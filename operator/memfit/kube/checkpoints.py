"""The checkpoint volume of a job: a PVC memfit creates (the default), the user's claim, or an emptyDir.

Durable by default (issue #16): a re-plan's attempt or a replaced pod resumes from the checkpoint the
last pod wrote, which an `emptyDir` (gone with its pod) cannot give. The created claim is owned by the
MOTJ, so the garbage collector deletes it with the job; a claim the user names is never created or
deleted by memfit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.plan import Plan
from memfit.kube.common import Manifest, Owner, metadata
from memfit.kube.names import COMPONENT_TRAINER, job_labels

GIB = 1 << 30
READ_WRITE_ONCE = "ReadWriteOnce"
READ_WRITE_MANY = "ReadWriteMany"
ACCESS_MODES = (READ_WRITE_ONCE, READ_WRITE_MANY)
# The trainer keeps MEMFIT_KEEP_CHECKPOINTS complete checkpoints (default 2, memfit_trainer.checkpoints)
# and deletes the oldest only after the next one is complete: 3 copies live at the peak.
CHECKPOINT_COPIES = 3
# Room for what the model-state estimate leaves out: RNG and data-order state, metadata, filesystem
# overhead, and a re-plan whose model states come out bigger than the first plan's.
SIZE_MARGIN = 1.25
DEFAULT_MIN_BYTES = 10 * GIB


class VolumeKind(StrEnum):
    CREATED = "created"  # `<job>-checkpoints`, made by memfit and owned by the job
    CLAIM = "claim"  # the user's training.checkpoint.volumeClaim
    EMPTY_DIR = "emptyDir"  # asked for with training.checkpoint.emptyDir


@dataclass(frozen=True, slots=True)
class CheckpointStorage:
    """Operator settings for the claims memfit creates (chart values `checkpoints.*`)."""

    storage_class: str = ""  # "" = the cluster's default StorageClass
    access_mode: str = READ_WRITE_ONCE
    min_bytes: int = DEFAULT_MIN_BYTES


@dataclass(frozen=True, slots=True)
class CheckpointVolume:
    """Where one job's checkpoints live."""

    kind: VolumeKind
    claim: str | None  # None for an emptyDir

    @property
    def durable(self) -> bool:
        return self.kind != VolumeKind.EMPTY_DIR


def checkpoint_claim_name(job: str) -> str:
    return f"{job}-checkpoints"


def checkpoint_volume(spec: MemoryOptimizedTrainingJobSpec, job: str) -> CheckpointVolume:
    """The job's checkpoint volume from its spec: the named claim, an emptyDir when asked, else ours."""
    checkpoint = spec.training.checkpoint
    if checkpoint.volume_claim:
        return CheckpointVolume(VolumeKind.CLAIM, checkpoint.volume_claim)
    if checkpoint.empty_dir:
        return CheckpointVolume(VolumeKind.EMPTY_DIR, None)
    return CheckpointVolume(VolumeKind.CREATED, checkpoint_claim_name(job))


def shared_across_nodes(access_modes: Sequence[str]) -> bool:
    """Every node of a multi-node plan can mount it at once (the resume reads every rank's shards)."""
    return READ_WRITE_MANY in access_modes


def estimate_checkpoint_bytes(plan: Plan) -> int:
    """Bytes of one checkpoint: the plan's model states (weights + optimizer state) of the whole job.

    From the per-GPU breakdown: sharded states (ZeRO/FSDP stage >= 1 shards the optimizer state, 3 also
    the weights: ZeRO paper, Rajbhandari et al. 2020, section 5) add up over the data-parallel ranks;
    replicated ones are saved once. Offloaded optimizer state (host RAM or NVMe) is saved too."""
    memory, ranks = plan.memory, plan.world_size
    weights = memory.parameters_bytes * (ranks if plan.zero_stage >= 3 else 1)
    optimizer_per_rank = memory.optimizer_bytes + memory.host_bytes - memory.host_activation_bytes + memory.nvme_bytes
    optimizer = optimizer_per_rank * (ranks if plan.zero_stage >= 1 else 1)
    return int(weights + optimizer)


def estimate_hub_download_bytes(plan: Plan) -> int:
    """Bytes of a hub model the download step puts on the claim (HF_HOME): its parameters at the
    dtype its config names (`torch_dtype` / `dtype`), 4 bytes each when it names none; 0 when the
    weights do not come from the hub."""
    hf = plan.problem.huggingface if plan.problem is not None else None
    if hf is None or not hf.hub_weights:
        return 0
    config = hf.config or {}
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    width = 2 if dtype in ("bfloat16", "float16") else 4
    if plan.parameters:
        return plan.parameters * width
    unsharded = plan.memory.parameters_bytes * (plan.world_size if plan.zero_stage >= 3 else 1)
    return unsharded * width // 2  # the breakdown holds 16-bit weights (or 4-bit for QLoRA: more)


def estimate_claim_bytes(plan: Plan, *, min_bytes: int = DEFAULT_MIN_BYTES) -> int:
    """The size memfit requests: the copies the trainer keeps and a hub model's download, a margin,
    whole GiB, at least `min_bytes`."""
    wanted = (estimate_checkpoint_bytes(plan) * CHECKPOINT_COPIES + estimate_hub_download_bytes(plan)) * SIZE_MARGIN
    return max(min_bytes, math.ceil(wanted / GIB) * GIB)


def build_checkpoint_claim(*, owner: Owner, plan: Plan, storage: CheckpointStorage) -> Manifest:
    """PersistentVolumeClaim `<job>-checkpoints`, owned by the job (deleted with it by the GC)."""
    spec: Manifest = {
        "accessModes": [storage.access_mode],
        "resources": {"requests": {"storage": quantity(estimate_claim_bytes(plan, min_bytes=storage.min_bytes))}},
        "volumeMode": "Filesystem",
    }
    if storage.storage_class:
        spec["storageClassName"] = storage.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(
            name=checkpoint_claim_name(owner.name), owner=owner, labels=job_labels(owner.name, COMPONENT_TRAINER)
        ),
        "spec": spec,
    }


def quantity(value: int) -> str:
    """Bytes as a Kubernetes quantity: whole GiB as `NGi`, else plain bytes."""
    return f"{value // GIB}Gi" if value % GIB == 0 else str(value)


def parse_quantity(text: str) -> int:
    """A storage quantity (`10Gi`, `500Mi`, `1T`, `2048`) in bytes; ValueError when it is not one."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}  # fmt: skip
    text = text.strip()
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            number = text[: -len(suffix)]
            if number.replace(".", "", 1).isdigit():
                return int(float(number) * units[suffix])
            break
    if text.isdigit():
        return int(text)
    raise ValueError(f"{text!r} is not a storage quantity (e.g. 10Gi, 500Mi, 2048)")

"""Operator-wide settings (flags and Helm values)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from memfit.kube.checkpoints import ACCESS_MODES, parse_quantity
from memfit.kube.common import FS_GROUP_CHANGE_POLICIES, RUN_AS_USER

DEFAULT_TRAINER_IMAGE = "memfit-trainer:0.1.0"  # set your registry's copy with --trainer-image / Helm


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    trainer_image: str = DEFAULT_TRAINER_IMAGE
    image_pull_policy: str = "IfNotPresent"
    extra_pod_labels: dict[str, str] = field(default_factory=dict)
    namespaces: tuple[str, ...] = ()  # empty = cluster-wide
    requeue_seconds: float = 5.0
    trainer_service_account: str = ""
    world_ttl_seconds: float = 1.0  # pools + capacity snapshot shared by the reconciles of this long
    node_ttl_seconds: float = 10.0  # the Node list behind it (nodes change far less often than pods)
    # Reconciles in parallel (threads; each mostly waits for the API server: a launch pass is about eight
    # round trips in a row). 16 launched a burst of 1,000 jobs at 0.43 of a bare client's rate on the
    # 2-core test bed, 48 at 1.07 (docs/reliability.md, benchmarks/scale.py).
    workers: int = 64
    # The checkpoint claims memfit creates (chart values checkpoints.*): "" = the default StorageClass.
    checkpoint_storage_class: str = ""
    checkpoint_access_mode: str = "ReadWriteOnce"  # ReadWriteMany lets plans span nodes
    checkpoint_min_bytes: int = 10 << 30  # the floor under the model-state estimate
    hub_endpoint: str = ""  # HF_ENDPOINT of the training pods (chart hub.endpoint): a hub mirror
    # The memfit.dev/memory-fit Kueue AdmissionCheck controller (chart kueue.admissionCheck): off, or
    # the seconds between its passes.
    admission_check_seconds: float = 0.0
    pod_fs_group: int = RUN_AS_USER  # fsGroup of profiling and training pods (chart trainer.fsGroup)
    pod_fs_group_change_policy: str = "OnRootMismatch"  # chart trainer.fsGroupChangePolicy
    progress_seconds: float = 15.0  # status.progress refresh: rank 0's metrics read at most this often

    @classmethod
    def from_env(cls, **overrides: object) -> OperatorSettings:
        labels: dict[str, str] = {}
        for item in os.environ.get("MEMFIT_EXTRA_POD_LABELS", "").split(","):
            if "=" in item:
                key, value = item.split("=", 1)
                labels[key.strip()] = value.strip()
        base = cls(
            trainer_image=os.environ.get("MEMFIT_TRAINER_IMAGE", DEFAULT_TRAINER_IMAGE),
            image_pull_policy=os.environ.get("MEMFIT_IMAGE_PULL_POLICY", "IfNotPresent"),
            extra_pod_labels=labels,
            workers=_positive_int("MEMFIT_WORKERS (operator.workers)", os.environ.get("MEMFIT_WORKERS", "64")),
            checkpoint_storage_class=os.environ.get("MEMFIT_CHECKPOINT_STORAGE_CLASS", ""),
            checkpoint_access_mode=_access_mode(os.environ.get("MEMFIT_CHECKPOINT_ACCESS_MODE", "ReadWriteOnce")),
            checkpoint_min_bytes=parse_quantity(os.environ.get("MEMFIT_CHECKPOINT_MIN_SIZE", "10Gi")),
            hub_endpoint=_hub_endpoint(os.environ.get("MEMFIT_HUB_ENDPOINT", "")),
            admission_check_seconds=_admission_check(os.environ.get("MEMFIT_ADMISSION_CHECK_SECONDS", "0")),
            pod_fs_group=_fs_group(os.environ.get("MEMFIT_POD_FS_GROUP", str(RUN_AS_USER))),
            pod_fs_group_change_policy=_change_policy(os.environ.get("MEMFIT_POD_FS_GROUP_CHANGE_POLICY", "OnRootMismatch")),
            progress_seconds=_positive("MEMFIT_PROGRESS_SECONDS", os.environ.get("MEMFIT_PROGRESS_SECONDS", "15")),
        )
        values = {name: getattr(base, name) for name in cls.__slots__}  # type: ignore[attr-defined]
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def _positive(name: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{name} must be a number of seconds above 0; got {value!r}")
    return seconds


def _positive_int(name: str, value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a whole number of at least 1; got {value!r}")
    return count


def _admission_check(value: str) -> float:
    if value.strip() in ("", "0"):
        return 0.0
    return _positive("MEMFIT_ADMISSION_CHECK_SECONDS", value)


def _hub_endpoint(value: str) -> str:
    value = value.strip().rstrip("/")
    if value and not value.startswith(("http://", "https://")):
        raise ValueError(f"MEMFIT_HUB_ENDPOINT (hub.endpoint) must be an http:// or https:// URL; got {value!r}")
    return value


def _access_mode(value: str) -> str:
    if value not in ACCESS_MODES:
        raise ValueError(f"MEMFIT_CHECKPOINT_ACCESS_MODE (checkpoints.accessMode) must be one of "
                         f"{', '.join(ACCESS_MODES)}; got {value!r}")
    return value


def _fs_group(value: str) -> int:
    try:
        group = int(value)
    except ValueError:
        group = 0
    if not 0 < group < 2**31:
        raise ValueError(f"MEMFIT_POD_FS_GROUP (trainer.fsGroup) must be a group ID from 1 to {2**31 - 1}; got {value!r}")
    return group


def _change_policy(value: str) -> str:
    if value not in FS_GROUP_CHANGE_POLICIES:
        raise ValueError(
            f"MEMFIT_POD_FS_GROUP_CHANGE_POLICY (trainer.fsGroupChangePolicy) must be one of "
            f"{', '.join(FS_GROUP_CHANGE_POLICIES)}; got {value!r}"
        )
    return value

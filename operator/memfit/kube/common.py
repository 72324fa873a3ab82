"""Shared manifest pieces: owner references, the restricted pod security context, pool placement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit.api.common import Toleration

Manifest = dict[str, Any]

RUN_AS_USER = 1000
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TOLERATION: Manifest = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True, slots=True)
class Owner:
    """The MOTJ that owns a child (controller ownerReference)."""

    name: str
    namespace: str
    uid: str
    api_version: str = "memfit.dev/v1alpha1"
    kind: str = "MemoryOptimizedTrainingJob"
    annotations: dict[str, str] = field(default_factory=dict, compare=False)

    def reference(self) -> Manifest:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """How a DRA pool's pods ask for devices (memfit.kube.dra): the DeviceClass, the driver whose
    attributes and capacity the selector reads, and the MIG profile of a slice pool."""

    device_class: str
    driver: str
    mig_profile: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where pods go: a pool's node selector and tolerations."""

    pool: str
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...] = ()
    gpu_resource: str = GPU_RESOURCE  # what a pod requests per GPU: nvidia.com/gpu or a MIG profile's
    dra: DeviceRequest | None = None  # a DRA pool: a ResourceClaim per pod instead of gpu_resource


@dataclass(frozen=True, slots=True)
class PodSettings:
    """Operator-wide settings for the pods memfit creates (from Helm values / flags)."""

    image: str
    image_pull_policy: str = "IfNotPresent"
    extra_labels: dict[str, str] = field(default_factory=dict)
    service_account: str = ""
    hub_endpoint: str = ""  # HF_ENDPOINT for the pods (a hub mirror); "" = the hub itself
    fs_group: int = RUN_AS_USER  # the group volumes are made readable by (chart trainer.fsGroup)
    fs_group_change_policy: str = "OnRootMismatch"  # chart trainer.fsGroupChangePolicy


def metadata(
    *, name: str, owner: Owner, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> Manifest:
    meta: Manifest = {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


FS_GROUP_CHANGE_POLICIES = ("OnRootMismatch", "Always")


def pod_security_context(pod: PodSettings) -> Manifest:
    """Pod Security Standard `restricted`: non-root, seccomp RuntimeDefault. The fsGroup makes the files
    of volumes with ownership management (most CSI drivers, emptyDir) group-readable by the trainer;
    OnRootMismatch skips the recursive change when the volume's root already matches (large models)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": pod.fs_group,
        "fsGroupChangePolicy": pod.fs_group_change_policy,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def tolerations(placement: Placement) -> list[Manifest]:
    out = [t.to_wire() for t in placement.tolerations]
    if not any(t.get("key") == GPU_RESOURCE for t in out):
        out.append(dict(GPU_TOLERATION))
    return out

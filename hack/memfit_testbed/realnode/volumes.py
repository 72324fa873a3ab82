"""Claims on the real node: PersistentVolumeClaims statically bound to hostPath PersistentVolumes in folders
under the kubelet's root (the teardown removes them), for a user's models, data and output
(`hack/testcluster claims`, docs/realnode.md) and the tests' checkpoint volumes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from memfit_testbed.realnode.hostchanges import KUBELET_ROOT

VOLUMES_ROOT = KUBELET_ROOT / "volumes-local"
LABEL = "memfit.dev/real-node"


def volume_folder(namespace: str, claim: str) -> Path:
    """The host folder that backs claim `claim` of `namespace` (also the PersistentVolume's name)."""
    return VOLUMES_ROOT / volume_name(namespace, claim)


def volume_name(namespace: str, claim: str) -> str:
    return f"{namespace}-{claim}"


def build_local_volume(*, namespace: str, claim: str, node_name: str, size: str) -> tuple[dict[str, Any],
                                                                                         dict[str, Any]]:
    """(PersistentVolume, PersistentVolumeClaim): a hostPath volume pinned to the node and pre-bound to
    the claim (storageClassName "" on both: no provisioner, no default StorageClass, takes part)."""
    name = volume_name(namespace, claim)
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": namespace, "name": claim},
                 "hostPath": {"path": str(volume_folder(namespace, claim)), "type": "Directory"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}]}}}}
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace, "labels": {LABEL: "true"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": name,
                 "resources": {"requests": {"storage": size}}}}
    return pv, pvc


def ensure_local_volume(api: Any, *, namespace: str, claim: str, node_name: str, size: str = "1Gi") -> Path:
    """Create the folder, the PersistentVolume and the claim (each kept when it exists already, so a rerun
    changes nothing); returns the folder. `api` is a kubernetes CoreV1Api."""
    from kubernetes.client.exceptions import ApiException

    folder = volume_folder(namespace, claim)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o1777)  # any pod UID may write, as on a fresh volume
    pv, pvc = build_local_volume(namespace=namespace, claim=claim, node_name=node_name, size=size)
    for create, args in ((api.create_persistent_volume, (pv,)),
                         (api.create_namespaced_persistent_volume_claim, (namespace, pvc))):
        try:
            create(*args)
        except ApiException as e:
            if e.status != 409:
                raise
    return folder


def delete_local_volume(api: Any, *, namespace: str, claim: str) -> None:
    """Delete the claim, its PersistentVolume and the folder (absent ones are fine)."""
    from kubernetes.client.exceptions import ApiException

    for delete, args in ((api.delete_namespaced_persistent_volume_claim, (claim, namespace)),
                         (api.delete_persistent_volume, (volume_name(namespace, claim),))):
        try:
            delete(*args)
        except ApiException as e:
            if e.status != 404:
                raise
    shutil.rmtree(volume_folder(namespace, claim), ignore_errors=True)

"""A hostPath volume provisioner for the test cluster (the role local-path-provisioner plays in kind).

The test cluster has no storage driver, so a PersistentVolumeClaim (memfit's `<job>-checkpoints`, made
for every job) would stay Pending and its pods unschedulable. This provisioner owns the default
StorageClass `memfit-local`: for each Pending claim of that class it creates a PersistentVolume
pre-bound to the claim (claimRef with its uid; kube-controller-manager's PV controller completes the
binding), whose hostPath is `<root>/<namespace>/<claim>` — the folder the local pod runner mounts for
every pod of the claim. A Released volume (its claim deleted, e.g. with its job by the garbage
collector) is deleted with its folder, so a new job of the same name starts with an empty volume.
Every access mode is granted: one machine, one folder.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

STORAGE_CLASS = "memfit-local"
PROVISIONER = "testbed.memfit.dev/hostpath"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
DELETES_PER_PASS = 50
log = logging.getLogger("provisioner")
Obj = dict[str, Any]


def claim_folder(root: Path, namespace: str, claim: str) -> Path:
    """The folder of a claim: the same one the pod runner mounts (pod_runner.PodRunner._containers)."""
    return root / namespace / claim


class Provisioner:
    """Provisions and deletes hostPath volumes for claims of STORAGE_CLASS; `sync` is one idempotent pass."""

    def __init__(self, core: client.CoreV1Api, storage: client.StorageV1Api, root: Path) -> None:
        self.core, self.storage, self.root = core, storage, root

    def ensure_storage_class(self) -> None:
        body = {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS: "true"}},
            "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
        }  # fmt: skip
        try:
            self.storage.create_storage_class(body)
        except ApiException as error:
            if error.status != 409:
                raise

    def sync(self, max_deletes: int = DELETES_PER_PASS) -> None:
        """Provision every Pending claim, then delete at most `max_deletes` released volumes: a namespace
        of 1,000 jobs deleted at once must not keep new claims waiting for a whole pass of deletions."""
        for claim in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            if (claim.spec.storage_class_name == STORAGE_CLASS and not claim.spec.volume_name
                    and (claim.status.phase or "Pending") == "Pending"):  # fmt: skip
                self._provision(claim)
        released = [v for v in self.core.list_persistent_volume().items
                    if (v.metadata.annotations or {}).get(PROVISIONED_BY) == PROVISIONER
                    and (v.status.phase or "") in ("Released", "Failed")]
        for volume in released[:max_deletes]:
            self._delete(volume)

    def _provision(self, claim: Any) -> None:
        meta = claim.metadata
        try:
            self.core.read_persistent_volume(f"pvc-{meta.uid}")
            return  # provisioned on an earlier pass; the PV controller has not bound it yet
        except ApiException as error:
            if error.status != 404:
                raise
        folder = claim_folder(self.root, meta.namespace, meta.name)
        shutil.rmtree(folder, ignore_errors=True)  # a new volume is empty, whatever an old claim left
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)  # pods run as a non-root user; a hostPath gets no fsGroup ownership
        body: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{meta.uid}", "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": claim.spec.resources.requests["storage"]},
                "accessModes": list(claim.spec.access_modes or ["ReadWriteOnce"]),
                "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta.namespace,
                             "name": meta.name, "uid": meta.uid},
            },
        }  # fmt: skip
        try:
            self.core.create_persistent_volume(body)
            log.info("provisioned pvc-%s for %s/%s at %s", meta.uid, meta.namespace, meta.name, folder)
        except ApiException as error:
            if error.status != 409:
                raise

    def _delete(self, volume: Any) -> None:
        ref = volume.spec.claim_ref
        try:
            self.core.delete_persistent_volume(volume.metadata.name)
        except ApiException as error:
            if error.status != 404:
                raise
            return
        if ref is not None:
            shutil.rmtree(claim_folder(self.root, ref.namespace, ref.name), ignore_errors=True)
        log.info("deleted %s (%s)", volume.metadata.name, volume.status.phase)

    def run(self, stop: threading.Event, interval_seconds: float = 1.0) -> None:
        self.ensure_storage_class()
        while not stop.is_set():
            try:
                self.sync()
            except Exception:
                log.exception("provisioner pass failed")
            stop.wait(interval_seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--root", type=Path, required=True, help="folder holding <namespace>/<claim> volumes")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    Provisioner(client.CoreV1Api(api), client.StorageV1Api(api), args.root.resolve()).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())

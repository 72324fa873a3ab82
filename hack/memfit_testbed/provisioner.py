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
import json
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


def _items(response: Any) -> list[Obj]:
    return list(json.loads(response.data).get("items") or [])


def claim_folder(root: Path, namespace: str, claim: str) -> Path:
    """The folder of a claim: the same one the pod runner mounts (pod_runner.PodRunner._containers)."""
    return root / namespace / claim


class Provisioner:
    """Provisions and deletes hostPath volumes for claims of STORAGE_CLASS; `sync` is one idempotent pass."""

    def __init__(self, core: client.CoreV1Api, storage: client.StorageV1Api, root: Path) -> None:
        self.core, self.storage, self.root = core, storage, root
        self._provisioned: set[str] = set()  # uids of claims whose volume exists (the PV controller binds it)

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

    def sync(self, max_deletes: int = DELETES_PER_PASS) -> bool:
        """Provision every Pending claim, then delete at most `max_deletes` released volumes (a namespace of
        1,000 jobs deleted at once must not keep new claims waiting behind a pass of deletions). Lists are
        read as raw JSON (decoding 2,000 objects into the client's models each second kept the provisioner
        at about 4 claims a second on 2 busy cores, behind the scale benchmark's 10 jobs a second), and a
        claim provisioned by this process is not looked up again. True when it did any work."""
        claims = _items(self.core.list_persistent_volume_claim_for_all_namespaces(_preload_content=False))
        work = False
        for claim in claims:
            spec, meta = claim.get("spec") or {}, claim["metadata"]
            pending = ((claim.get("status") or {}).get("phase") or "Pending") == "Pending"
            if (spec.get("storageClassName") == STORAGE_CLASS and not spec.get("volumeName") and pending
                    and meta["uid"] not in self._provisioned):  # fmt: skip
                self._provision(claim)
                work = True
        volumes = _items(self.core.list_persistent_volume(_preload_content=False))
        released = [v for v in volumes
                    if ((v["metadata"].get("annotations") or {}).get(PROVISIONED_BY) == PROVISIONER
                        and ((v.get("status") or {}).get("phase") or "") in ("Released", "Failed"))]
        for volume in released[:max_deletes]:
            self._delete(volume)
        live = {v["metadata"]["name"] for v in volumes}
        self._provisioned &= {c["metadata"]["uid"] for c in claims if f"pvc-{c['metadata']['uid']}" in live}
        return work or bool(released)

    def _provision(self, claim: Obj) -> None:
        meta, spec = claim["metadata"], claim.get("spec") or {}
        folder = claim_folder(self.root, meta["namespace"], meta["name"])
        body: Obj = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{meta['uid']}", "annotations": {PROVISIONED_BY: PROVISIONER}},
            "spec": {
                "capacity": {"storage": ((spec.get("resources") or {}).get("requests") or {})["storage"]},
                "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                "storageClassName": STORAGE_CLASS, "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                             "name": meta["name"], "uid": meta["uid"]},
            },
        }  # fmt: skip
        try:
            self.core.create_persistent_volume(body, _preload_content=False)
        except ApiException as error:
            if error.status != 409:
                raise
            self._provisioned.add(meta["uid"])  # an earlier pass (or process) made it: the PV controller binds it
            return
        # Emptied only for a volume this pass created: a new volume is empty, whatever an old claim left.
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)  # pods run as a non-root user; a hostPath gets no fsGroup ownership
        self._provisioned.add(meta["uid"])
        log.info("provisioned pvc-%s for %s/%s at %s", meta["uid"], meta["namespace"], meta["name"], folder)

    def _delete(self, volume: Obj) -> None:
        ref = (volume.get("spec") or {}).get("claimRef")
        try:
            self.core.delete_persistent_volume(volume["metadata"]["name"], _preload_content=False)
        except ApiException as error:
            if error.status != 404:
                raise
            return
        if ref is not None:
            shutil.rmtree(claim_folder(self.root, ref["namespace"], ref["name"]), ignore_errors=True)
        log.info("deleted %s (%s)", volume["metadata"]["name"], (volume.get("status") or {}).get("phase"))

    def run(self, stop: threading.Event, interval_seconds: float = 1.0, busy_seconds: float = 0.2) -> None:
        """A pass every `interval_seconds`, or every `busy_seconds` while passes find work."""
        self.ensure_storage_class()
        while not stop.is_set():
            busy = False
            try:
                busy = self.sync()
            except Exception:
                log.exception("provisioner pass failed")
            stop.wait(busy_seconds if busy else interval_seconds)


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

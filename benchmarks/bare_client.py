"""The scale benchmark's peer: a bare Kubernetes client writing the same objects memfit wrote.

After memfit launched a burst of jobs, this replays what it created for each of them — the MOTJ, its
plan ConfigMap, headless Service, checkpoint PersistentVolumeClaim and training Job — into a fresh
namespace of the same cluster, from as many client threads as the burst used, in memfit's order (the
MOTJ first, its children owned by it). No reads, no decisions, no status patches: the rate the API
server and a Python client reach on these objects on this machine, which memfit's launch rate is
reported against (benchmarks/scale.py, docs/reliability.md). The replayed Jobs are created suspended,
so they add no pods; nothing else about them differs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from memfit_testbed.cluster_helpers import Kube

Manifest = dict[str, Any]
GROUP, VERSION, MOTJ = "memfit.dev", "v1alpha1", "memoryoptimizedtrainingjobs"
JOB_LABEL = "memfit.dev/job"
# Fields the API server sets, or that would pin a copy to the original object.
SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "ownerReferences",
              "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers")
GENERATED_JOB_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid", "job-name",
                        "batch.kubernetes.io/job-name")


def _clean(obj: Manifest, kind: str, api_version: str) -> Manifest:
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_SET and k != "namespace"}
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if not k.startswith(("pv.kubernetes.io/", "volume.", "kubectl.kubernetes.io/"))}
    out: Manifest = {"apiVersion": api_version, "kind": kind, "metadata": meta}
    for key in ("spec", "data"):
        if key in obj:
            out[key] = obj[key]
    if kind == "Job":
        spec = dict(out["spec"])
        spec.pop("selector", None)
        spec["suspend"] = True
        template = dict(spec["template"])
        labels = {k: v for k, v in (template["metadata"].get("labels") or {}).items() if k not in GENERATED_JOB_LABELS}
        template["metadata"] = dict(template["metadata"], labels=labels)
        spec["template"] = template
        out["spec"] = spec
    elif kind == "Service":
        out["spec"] = {k: v for k, v in out["spec"].items() if k not in ("clusterIPs", "ipFamilies", "ipFamilyPolicy")}
    elif kind == "PersistentVolumeClaim":
        out["spec"] = {k: v for k, v in out["spec"].items() if k != "volumeName"}
    return out


def memfit_writes(kube: Kube, namespace: str) -> dict[str, list[Manifest]]:
    """Per job, the MOTJ and the children memfit created for it, cleaned for a replay."""
    custom = client.CustomObjectsApi(kube.api_client)
    lists = {
        "ConfigMap": ("v1", kube.raw(kube.core.list_namespaced_config_map, namespace)),
        "Service": ("v1", kube.raw(kube.core.list_namespaced_service, namespace)),
        "PersistentVolumeClaim": ("v1", kube.raw(kube.core.list_namespaced_persistent_volume_claim, namespace)),
        "Job": ("batch/v1", kube.raw(kube.batch.list_namespaced_job, namespace)),
    }
    children: dict[str, list[Manifest]] = defaultdict(list)
    for kind, (api_version, listed) in lists.items():
        for item in (listed or {}).get("items", []):
            owner = (item["metadata"].get("labels") or {}).get(JOB_LABEL)
            if owner:
                children[owner].append(_clean(item, kind, api_version))
    motjs = Kube.raw(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, MOTJ) or {}
    writes: dict[str, list[Manifest]] = {}
    for item in motjs.get("items", []):
        name = item["metadata"]["name"]
        if children.get(name):
            order = {"ConfigMap": 0, "Service": 1, "PersistentVolumeClaim": 2, "Job": 3}
            writes[name] = [_clean(item, "MemoryOptimizedTrainingJob", f"{GROUP}/{VERSION}"),
                            *sorted(children[name], key=lambda m: order[m["kind"]])]
    return writes


def replay(kube: Kube, writes: dict[str, list[Manifest]], namespace: str, threads: int) -> dict[str, Any]:
    """Create every job's objects in `namespace` from `threads` threads; the seconds it took."""
    kube.core.create_namespace({"metadata": {"name": namespace}})
    kube.wait("default ServiceAccount", lambda: kube.raw(kube.core.read_namespaced_service_account, "default",
                                                         namespace), timeout=60)
    custom = client.CustomObjectsApi(kube.api_client)

    def one(objects: list[Manifest]) -> None:
        motj, *rest = objects
        made = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, motj)
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MemoryOptimizedTrainingJob",
                 "name": made["metadata"]["name"], "uid": made["metadata"]["uid"], "controller": True,
                 "blockOwnerDeletion": True}
        for obj in rest:
            obj = dict(obj, metadata=dict(obj["metadata"], ownerReferences=[owner]))
            if obj["kind"] == "ConfigMap":
                kube.core.create_namespaced_config_map(namespace, obj)
            elif obj["kind"] == "Service":
                kube.core.create_namespaced_service(namespace, obj)
            elif obj["kind"] == "PersistentVolumeClaim":
                kube.core.create_namespaced_persistent_volume_claim(namespace, obj)
            else:
                kube.batch.create_namespaced_job(namespace, obj)

    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, writes.values()))
    seconds = time.monotonic() - t0
    objects = sum(len(v) for v in writes.values())
    return {"jobs": len(writes), "objects": objects, "threads": threads, "seconds": round(seconds, 2),
            "jobs_per_second": round(len(writes) / seconds, 1) if seconds > 0 else None}

"""Helpers for the Kueue integration tests: queue-labelled Jobs, Workload reads, the flavors of the KWOK pools."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import yaml
from memfit.api.pool import GPUNodePool
from memfit.kube.kueue import LABEL_QUEUE, build_kueue_setup
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.paths import REPO

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
KWOK_KEEP_RUNNING = {"pod-complete.stage.kwok.x-k8s.io/delay": "1h"}


def kwok_gpunodepools() -> list[GPUNodePool]:
    docs = yaml.safe_load_all((REPO / "hack" / "kwok" / "gpunodepools.yaml").read_text())
    return [GPUNodePool.model_validate(d) for d in docs if d]


def apply(docs: list[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    subprocess.run(["kubectl", "apply", "--server-side", "-f", "-"], input=body, text=True, check=True,
                   capture_output=True)


def delete(docs: list[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    subprocess.run(["kubectl", "delete", "--ignore-not-found", "--wait=false", "-f", "-"], input=body, text=True,
                   check=False, capture_output=True)


def queued_job(name: str, queue: str, selector: dict[str, str], gpus: int = 1) -> dict[str, Any]:
    """A Job as memfit builds one for a pool: the pool's nodeSelector, the GPU toleration, the queue label;
    its KWOK pod stays Running until deleted."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {LABEL_QUEUE: queue}},
        "spec": {
            "suspend": True,
            "template": {
                "metadata": {"annotations": KWOK_KEEP_RUNNING},
                "spec": {
                    "restartPolicy": "Never", "nodeSelector": selector, "tolerations": [GPU_TOLERATION],
                    "containers": [{"name": "main", "image": "memfit/fake:1",
                                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                },
            },
        },
    }  # fmt: skip


def workload_of(kube: Kube, ns: str, job: str) -> dict[str, Any] | None:
    """The Kueue Workload owned by Job `job`."""
    out = kube.raw(_custom(kube).list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2", ns, "workloads")
    for item in (out or {}).get("items", []):
        if any(ref.get("name") == job and ref.get("kind") == "Job" for ref in item["metadata"].get("ownerReferences", [])):
            return dict(item)
    return None


def _custom(kube: Kube) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(kube.api_client)


def admitted(kube: Kube, ns: str, job: str) -> dict[str, Any] | None:
    wl = workload_of(kube, ns, job)
    cond = condition(wl, "Admitted") if wl else None
    return wl if cond and cond["status"] == "True" else None


def gpu_flavor(workload: dict[str, Any]) -> str:
    assignment = workload["status"]["admission"]["podSetAssignments"][0]
    return str(assignment["flavors"]["nvidia.com/gpu"])


def running_pod(kube: Kube, ns: str, job: str) -> dict[str, Any] | None:
    pods = [p for p in kube.pods(ns, f"job-name={job}") if (p.get("status") or {}).get("phase") == "Running"]
    return pods[0] if pods else None


def setup(ns: str, quota: dict[str, int]) -> list[dict[str, Any]]:
    pools = kwok_gpunodepools()
    docs = build_kueue_setup(pools, cluster_queue=f"cq-{ns}", local_queue="gpu", namespace=ns,
                             gpu_quota={p.metadata.name: quota.get(p.metadata.name, 0) for p in pools})
    apply(docs)
    return docs


def patch_cluster_queue(kube: Kube, name: str, patch: dict[str, Any]) -> None:
    _custom(kube).patch_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name, patch)


def set_gpu_quota(kube: Kube, cq: str, gpus: dict[str, int], **spec: Any) -> None:
    """Set ClusterQueue `cq`'s nominal nvidia.com/gpu quota per flavor (flavors not named get 0), with
    other spec fields (`stopPolicy`...) in the same patch."""
    current = _custom(kube).get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", cq)
    groups = current["spec"]["resourceGroups"]
    for group in groups:
        for flavor in group["flavors"]:
            for res in flavor["resources"]:
                if res["name"] == "nvidia.com/gpu":
                    res["nominalQuota"] = gpus.get(flavor["name"], 0)
    patch_cluster_queue(kube, cq, {"spec": {**spec, "resourceGroups": groups}})

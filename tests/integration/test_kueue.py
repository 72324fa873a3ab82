"""The real Kueue (v0.17.0) on the test cluster: flavors made from GPUNodePools by `memfit kueue flavors`
admit Jobs onto exactly their pool, and a queue whose GPU quota is used up holds Jobs until it frees."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
import yaml
from memfit.api.pool import GPUNodePool
from memfit.kube.kueue import LABEL_QUEUE, build_kueue_setup
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.kueue import KueueManager
from memfit_testbed.paths import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

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


def test_kueue_webhook_suspends_a_queued_job(kueue: KueueManager, kube: Kube, namespace: str) -> None:
    """Kueue's mutating webhook, reached through the API server: a queue-labelled Job created running is
    suspended at creation; the same Job without the label is not."""
    docs = setup(namespace, {})
    try:
        job = queued_job("w", "gpu", {"memfit.dev/pool": "t4-spot"})
        job["spec"]["suspend"] = False
        created = kube.batch.create_namespaced_job(namespace, job)
        assert created.spec.suspend is True
        plain = queued_job("plain", "gpu", {"memfit.dev/pool": "t4-spot"})
        del plain["metadata"]["labels"][LABEL_QUEUE]
        plain["spec"]["suspend"] = False
        assert kube.batch.create_namespaced_job(namespace, plain).spec.suspend is False
    finally:
        delete(docs[-2:])


def test_exhausted_quota_queues_until_it_frees(kueue: KueueManager, kube: Kube, namespace: str) -> None:
    docs = setup(namespace, {"t4-spot": 1})
    try:
        t4 = {"memfit.dev/pool": "t4-spot"}
        kube.batch.create_namespaced_job(namespace, queued_job("first", "gpu", t4))
        wl = kube.wait("first admitted", lambda: admitted(kube, namespace, "first"), timeout=60)
        assert gpu_flavor(wl) == "t4-spot"
        pod = kube.wait("first's pod Running", lambda: running_pod(kube, namespace, "first"), timeout=60)
        assert pod["spec"]["nodeSelector"] == t4
        assert pod["spec"]["nodeName"].startswith("t4-spot-")

        kube.batch.create_namespaced_job(namespace, queued_job("second", "gpu", t4))

        def pending() -> dict[str, Any] | None:
            wl = workload_of(kube, namespace, "second")
            cond = condition(wl, "QuotaReserved") if wl else None
            return cond if cond and cond["status"] == "False" and cond["reason"] == "Pending" else None

        cond = kube.wait("second pending on quota", pending, timeout=60)
        assert "insufficient unused quota for nvidia.com/gpu in flavor t4-spot" in cond["message"], cond
        assert kube.batch.read_namespaced_job("second", namespace).spec.suspend is True
        assert not kube.pods(namespace, "job-name=second")

        kube.batch.delete_namespaced_job("first", namespace, propagation_policy="Background")
        wl = kube.wait("second admitted once first is gone", lambda: admitted(kube, namespace, "second"), timeout=90)
        assert gpu_flavor(wl) == "t4-spot"
        pod = kube.wait("second's pod Running", lambda: running_pod(kube, namespace, "second"), timeout=60)
        assert pod["spec"]["nodeName"].startswith("t4-spot-")
    finally:
        delete(docs[-2:])


def test_flavor_kueue_assigns_is_the_pool_of_the_selector(kueue: KueueManager, kube: Kube, namespace: str) -> None:
    """Every flavor has quota; Kueue tries them in order (a100 first), yet each Job gets the flavor of the
    pool its nodeSelector names, its pod keeps that selector and lands on that pool's nodes."""
    pools = kwok_gpunodepools()
    docs = setup(namespace, {p.metadata.name: 8 for p in pools})
    try:
        for pool in pools:
            name = f"on-{pool.metadata.name}-{uuid.uuid4().hex[:4]}"
            kube.batch.create_namespaced_job(namespace, queued_job(name, "gpu", dict(pool.spec.node_selector)))
            wl = kube.wait(f"{name} admitted", lambda n=name: admitted(kube, namespace, n), timeout=60)
            assert gpu_flavor(wl) == pool.metadata.name
            pod = kube.wait(f"{name} Running", lambda n=name: running_pod(kube, namespace, n), timeout=60)
            assert pod["spec"]["nodeSelector"] == dict(pool.spec.node_selector)
            node = kube.core.read_node(pod["spec"]["nodeName"])
            assert node.metadata.labels["memfit.dev/pool"] == pool.metadata.name
    finally:
        delete(docs[-2:])

"""The real Kueue (v0.19.1) on the test cluster: flavors made from GPUNodePools by `memfit kueue flavors`
admit Jobs onto exactly their pool, and a queue whose GPU quota is used up holds Jobs until it frees."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kueue_helpers import (
    admitted,
    delete,
    gpu_flavor,
    kwok_gpunodepools,
    queued_job,
    running_pod,
    setup,
    workload_of,
)
from memfit.kube.kueue import LABEL_QUEUE
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.kueue import KueueManager

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

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

"""Helpers of the injected-fault scenarios: results, waits, and acting as the kubelet or the cloud
(finishing a simulated trainer, removing a pool's nodes)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from memfit_testbed import kwok_pools
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.reliability.chaos import GROUP, MOTJ, VERSION


@dataclass
class FaultResult:
    """What one injected fault led to."""

    name: str
    injected: str
    expected: str
    observed: str
    ok: bool
    seconds: float
    details: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"seconds": round(self.seconds, 1)}


def _custom(kube: Kube) -> Any:
    return client.CustomObjectsApi(kube.api_client)


def get(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return dict(_custom(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, name))


def wait_for(what: str, fn: Callable[[], Any], timeout: float, interval: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached in {timeout:.0f}s (last: {json.dumps(last, default=str)[:500]})")


def wait_phase(
    kube: Kube, namespace: str, name: str, phases: tuple[str, ...], timeout: float
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        job = get(kube, namespace, name)
        return job if (job.get("status") or {}).get("phase") in phases else None

    try:
        return dict(wait_for(f"{name} in {phases}", check, timeout))
    except TimeoutError as error:
        status = get(kube, namespace, name).get("status") or {}
        raise TimeoutError(f"{error}; status: {json.dumps(status)[:1500]}") from None


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def outcomes(job: dict[str, Any]) -> list[str]:
    return [str(a.get("outcome")) for a in (job.get("status") or {}).get("attempts") or []]


def pods_of(kube: Kube, namespace: str, job: str, component: str) -> list[dict[str, Any]]:
    return kube.pods(namespace, f"memfit.dev/job={job},memfit.dev/component={component}")


def _result(
    name: str, injected: str, expected: str, job: dict[str, Any], checks: dict[str, bool], t0: float
) -> FaultResult:
    status = job.get("status") or {}
    failed = condition(job, "Failed")
    observed = f"{status.get('phase')} {outcomes(job)}" + (
        f" {failed.get('reason')}: {failed.get('message', '')[:200]}"
        if failed.get("status") == "True"
        else ""
    )
    bad = [k for k, ok in checks.items() if not ok]
    return FaultResult(name, injected, expected, observed, not bad, time.monotonic() - t0, bad)


def _create(kube: Kube, namespace: str, doc: dict[str, Any]) -> str:
    _custom(kube).create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, doc)
    return str(doc["metadata"]["name"])


def _own_problem(doc: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Give the job a problem of its own (no cached profile unless seeded, private learning)."""
    doc["spec"]["problem"] = {"builtin": {**doc["spec"]["problem"]["builtin"], "vocab": vocab}}
    return doc


def running_pods(kube: Kube, namespace: str, job: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in pods_of(kube, namespace, job, "trainer")
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def finish_pods(kube: Kube, namespace: str, job: str) -> list[str]:
    """Complete the job's running trainer pods, as the trainer exiting 0 would (a `long-*` job's pods
    run until this is called)."""
    done = running_pods(kube, namespace, job)
    for name in done:
        terminated = {"exitCode": 0, "reason": "Completed", "message": '{"reason": "Completed"}'}
        status = {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "memfit-trainer:test",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
        kube.core.patch_namespaced_pod_status(name, namespace, {"status": status})
    return done


def remove_nodes(kube: Kube, pool: str) -> int:
    """Delete a pool's nodes as a cloud does: their pods end Failed with a DisruptionTarget condition
    (what the pod garbage collector records for pods of a vanished node, here without its 40 s
    quarantine), then the Nodes go."""
    nodes = kwok_pools.pool_nodes(kube.core, pool)
    for node in nodes:
        listing = (
            kube.raw(kube.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}") or {}
        )
        for pod in listing.get("items", []):
            meta = pod["metadata"]
            gone = {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByPodGC",
                "message": f"node {node} was removed",
            }
            status = {
                "phase": "Failed",
                "conditions": [*(pod["status"].get("conditions") or []), gone],
                "containerStatuses": [
                    {**cs, "ready": False, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}
                    for cs in pod["status"].get("containerStatuses") or []
                ],
            }
            kube.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
        kwok_pools.delete_node(kube.core, node)
    return len(nodes)


def _job_exists(kube: Kube, namespace: str, name: str) -> bool:
    return kube.raw(kube.batch.read_namespaced_job, name, namespace) is not None


def _wait_running(kube: Kube, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    return wait_phase(kube, namespace, name, ("Running",), timeout)

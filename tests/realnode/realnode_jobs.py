"""Following a MOTJ on the real node to its end, with every pod it had (tests/realnode)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import wait_phase


def pods_of(kube: Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    return [p for p in kube.pods(namespace) if p["metadata"].get("labels", {}).get("memfit.dev/job") == job]


def run_to_end(kube: Kube, namespace: str, job: str, timeout: float, operator_log: Path
               ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Wait until the MOTJ is Succeeded or Failed, remembering every pod of it as last seen: memfit
    deletes a finished attempt's Job, and its pods go with it."""
    seen: dict[str, dict[str, Any]] = {}
    custom = client.CustomObjectsApi(kube.api_client)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pod in pods_of(kube, namespace, job):
            seen[pod["metadata"]["name"]] = pod
        obj = custom.get_namespaced_custom_object("memfit.dev", "v1alpha1", namespace,
                                                  "memoryoptimizedtrainingjobs", job)
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            for pod in pods_of(kube, namespace, job):
                seen[pod["metadata"]["name"]] = pod
            return obj, seen
        time.sleep(0.3)
    wait_phase(kube, namespace, job, ("Succeeded", "Failed"), timeout=1, operator_log=operator_log)
    raise AssertionError("unreachable")


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0].get("state", {}).get("terminated") or {})

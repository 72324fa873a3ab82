"""kopf wiring: every MOTJ and child event calls the one reconcile; a resync loop covers timeouts.

Only `@kopf.on.event` handlers are used: kopf then stores no progress or diff-base annotations and
adds no finalizers, so deleting a job never waits for the operator (owner GC removes children).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from memfit import metrics
from memfit.api.common import API_GROUP, API_VERSION
from memfit.controller.kubeapi import MOTJ_PLURAL, ForeignObjectError, KubeApi
from memfit.controller.pool_status import reconcile_pools
from memfit.controller.reconcile import reconcile_job
from memfit.controller.settings import OperatorSettings
from memfit.kube.names import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("memfit.operator")

TERMINAL = ("Succeeded", "Failed")


class Runtime:
    """Process-wide state of the operator: settings, API clients, per-job locks."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.api: KubeApi | None = None
        self.healthy = threading.Event()
        self.stop = threading.Event()
        self._locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()

    def lock(self, namespace: str, name: str) -> threading.Lock:
        with self._guard:
            return self._locks[(namespace, name)]


RUNTIME = Runtime()


def reconcile_by_name(namespace: str, name: str) -> None:
    """Fetch the freshest job and reconcile it; errors are logged and counted, never crash the operator."""
    api = RUNTIME.api
    if api is None:
        return
    with RUNTIME.lock(namespace, name):
        try:
            body = api.get_motj(namespace, name)
            if body is None:
                metrics.JOBS.forget(namespace, name)
                return
            started = time.perf_counter()
            decision = reconcile_job(api, body, settings=RUNTIME.settings)
            status = decision.status if decision else (body.get("status") or {})
            metrics.JOBS.observe(metrics.JobSnapshot.from_status(namespace, name, status))
            if decision:
                _count(namespace, decision.events)
                log.debug("reconciled %s/%s in %.3fs", namespace, name, time.perf_counter() - started)
        except ApiException as error:
            if error.status == 409:  # a concurrent write; the next event or resync retries
                return
            metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
            log.warning("reconcile %s/%s: API error %s %s", namespace, name, error.status, error.reason)
        except ForeignObjectError as error:
            metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
            log.error("reconcile %s/%s: %s", namespace, name, error)
        except Exception:
            metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
            log.exception("reconcile %s/%s failed", namespace, name)


def _count(namespace: str, events: list[tuple[str, str, str]]) -> None:
    for _, reason, _ in events:
        if reason in ("OutOfMemory", "NoCapacity"):
            metrics.REPLANS.labels(namespace, reason).inc()
        elif reason == "ProfilingFailed":
            metrics.PROFILING_FAILURES.labels(namespace).inc()


@kopf.on.startup()
def on_operator_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="memfit.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="memfit.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    RUNTIME.healthy.set()


@kopf.on.cleanup()
def on_operator_cleanup(**_: Any) -> None:
    RUNTIME.stop.set()
    RUNTIME.healthy.clear()


@kopf.on.event(API_GROUP, API_VERSION, MOTJ_PLURAL)
def on_motj_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    if event.get("type") == "DELETED":
        metrics.JOBS.forget(namespace, name)
        return
    reconcile_by_name(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
def on_child_job_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    reconcile_by_name(namespace, labels[LABEL_JOB])


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
def on_child_pod_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    reconcile_by_name(namespace, labels[LABEL_JOB])


@kopf.on.event(API_GROUP, API_VERSION, "gpunodepools")
def on_pool_event(**_: Any) -> None:
    if RUNTIME.api is not None:
        try:
            reconcile_pools(RUNTIME.api)
        except Exception:
            metrics.RECONCILE_ERRORS.labels("GPUNodePool").inc()
            log.exception("pool status update failed")


def resync_forever(interval_seconds: float) -> None:
    """Re-reconcile every unfinished job and the pools: capacity timeouts, missed events, crashes."""
    while not RUNTIME.stop.wait(interval_seconds):
        api = RUNTIME.api
        if api is None:
            continue
        try:
            reconcile_pools(api)
            namespaces = RUNTIME.settings.namespaces or (None,)
            for ns in namespaces:
                if ns is None:
                    items = api.custom.list_cluster_custom_object(API_GROUP, API_VERSION, MOTJ_PLURAL)[
                        "items"
                    ]
                else:
                    items = api.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, ns, MOTJ_PLURAL)[
                        "items"
                    ]
                for item in items:
                    if (item.get("status") or {}).get("phase") not in TERMINAL:
                        reconcile_by_name(item["metadata"]["namespace"], item["metadata"]["name"])
        except Exception:
            metrics.RECONCILE_ERRORS.labels("Resync").inc()
            log.exception("resync failed")

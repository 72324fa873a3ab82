"""kopf wiring: every MOTJ and child event calls the one reconcile; a resync loop covers timeouts.

Only `@kopf.on.event` handlers are used: kopf then stores no progress or diff-base annotations and
adds no finalizers, so deleting a job never waits for the operator (owner GC removes children).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from memfit import metrics
from memfit.api.common import API_GROUP, API_VERSION
from memfit.controller.kubeapi import MOTJ_PLURAL, ForeignObjectError, KubeApi
from memfit.controller.pool_status import reconcile_pools
from memfit.controller.reconcile import reconcile_job
from memfit.controller.settings import OperatorSettings
from memfit.controller.world import WorldCache
from memfit.kube.names import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("memfit.operator")

TERMINAL = ("Succeeded", "Failed")
REPLANS = ("OutOfMemory", "NoCapacity")  # attempt outcomes the next pass re-plans


class Runtime:
    """Process-wide state of the operator: settings, API clients, the shared world snapshot, and which
    jobs are being reconciled (one reconcile per job at a time; events during it coalesce into one
    more pass)."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.api: KubeApi | None = None
        self.world = WorldCache()
        self.healthy = threading.Event()
        self.stop = threading.Event()
        self._guard = threading.Lock()
        self._running: set[tuple[str, str]] = set()
        self._dirty: set[tuple[str, str]] = set()
        self._finished_at: dict[tuple[str, str], float] = {}
        self._written: dict[tuple[str, str], str] = {}  # resourceVersion our last status patch made
        self._terminal: set[tuple[str, str]] = set()

    def begin(self, key: tuple[str, str]) -> bool:
        """Claim the job; False when a reconcile of it is running (it will run once more for us)."""
        with self._guard:
            if key in self._running:
                self._dirty.add(key)
                return False
            self._running.add(key)
            return True

    def again(self, key: tuple[str, str]) -> bool:
        """After a pass: True when events arrived during it (run once more), else release the job."""
        with self._guard:
            if key in self._dirty:
                self._dirty.discard(key)
                return True
            self._running.discard(key)
            self._finished_at[key] = time.monotonic()
            return False

    def release(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._running.discard(key)
            self._dirty.discard(key)

    def reconciled_within(self, key: tuple[str, str], seconds: float) -> bool:
        with self._guard:
            return key in self._running or time.monotonic() - self._finished_at.get(key, -1e9) < seconds

    def forget(self, key: tuple[str, str]) -> None:
        with self._guard:
            self._finished_at.pop(key, None)
            self._written.pop(key, None)
            self._terminal.discard(key)

    def note(self, key: tuple[str, str], *, phase: str, written: str) -> None:
        """Remember the job's phase and the resourceVersion of our status patch (if any)."""
        with self._guard:
            if written:
                self._written[key] = written
            if phase in TERMINAL:
                self._terminal.add(key)
            else:
                self._terminal.discard(key)

    def own_write(self, key: tuple[str, str], resource_version: str) -> bool:
        """The MOTJ event shows exactly what our last status patch wrote: nothing new to reconcile."""
        with self._guard:
            return bool(resource_version) and self._written.get(key) == resource_version

    def terminal(self, key: tuple[str, str]) -> bool:
        """Known Succeeded/Failed: a child's event cannot change anything any more."""
        with self._guard:
            return key in self._terminal


RUNTIME = Runtime()


def reconcile_by_name(namespace: str, name: str, body: dict[str, Any] | None = None) -> None:
    """Reconcile the job (from `body` if given, else freshly read); errors are logged and counted, never
    crash the operator. Calls for a job that is being reconciled return at once and make that
    reconcile run one more pass, so an event storm costs one pass per job, not one per event."""
    api = RUNTIME.api
    if api is None:
        return
    key = (namespace, name)
    if not RUNTIME.begin(key):
        return
    try:
        followups = int(_reconcile_once(api, namespace, name, body))
        while 0 < followups <= 3 or RUNTIME.again(key):  # again() releases the job if no event came
            followups = followups + 1 if _reconcile_once(api, namespace, name, None) else 0
    except BaseException:
        RUNTIME.release(key)
        raise


def _reconcile_once(api: KubeApi, namespace: str, name: str, body: dict[str, Any] | None) -> bool:
    """One reconcile pass; True when it stored a finished attempt whose re-plan should run now (the
    event of our own status patch is skipped, so nothing else would trigger it before the resync)."""
    try:
        body = body or api.get_motj(namespace, name)
        if body is None:
            metrics.JOBS.forget(namespace, name)
            RUNTIME.forget((namespace, name))
            return False
        started = time.perf_counter()
        decision = reconcile_job(api, body, settings=RUNTIME.settings, world_source=RUNTIME.world.source(api))
        status = decision.status if decision else (body.get("status") or {})
        written = decision.resource_version if decision else ""
        RUNTIME.note((namespace, name), phase=str(status.get("phase", "")), written=written)
        metrics.JOBS.observe(metrics.JobSnapshot.from_status(namespace, name, status))
        if decision:
            _count(namespace, decision.events)
            log.debug("reconciled %s/%s in %.3fs", namespace, name, time.perf_counter() - started)
        return decision is not None and _replan_pending(status)
    except ApiException as error:
        if error.status == 409:  # a concurrent write; the next event or resync retries
            return False
        metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
        log.warning("reconcile %s/%s: API error %s %s", namespace, name, error.status, error.reason)
    except ForeignObjectError as error:
        metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
        log.error("reconcile %s/%s: %s", namespace, name, error)
    except Exception:
        metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
        log.exception("reconcile %s/%s failed", namespace, name)
    return False


def _replan_pending(status: dict[str, Any]) -> bool:
    attempts = status.get("attempts") or []
    return status.get("phase") not in TERMINAL and bool(attempts) and attempts[-1].get("outcome") in REPLANS


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
    settings.execution.max_workers = RUNTIME.settings.workers
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    RUNTIME.world = WorldCache(RUNTIME.settings.world_ttl_seconds, RUNTIME.settings.node_ttl_seconds)
    # kopf logs "Handler ... succeeded" for every event (10 per job); memfit logs its own decisions.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    RUNTIME.healthy.set()


@kopf.on.cleanup()
def on_operator_cleanup(**_: Any) -> None:
    RUNTIME.stop.set()
    RUNTIME.healthy.clear()


@kopf.on.event(API_GROUP, API_VERSION, MOTJ_PLURAL)
def on_motj_event(event: dict[str, Any], meta: Any, namespace: str, name: str, **_: Any) -> None:
    if event.get("type") == "DELETED":
        metrics.JOBS.forget(namespace, name)
        RUNTIME.forget((namespace, name))
        return
    if RUNTIME.own_write((namespace, name), str(meta.get("resourceVersion", ""))):
        return  # the echo of our own status patch: that reconcile already saw this state
    reconcile_by_name(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
def on_child_job_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    if not RUNTIME.terminal((namespace, labels[LABEL_JOB])):
        reconcile_by_name(namespace, labels[LABEL_JOB])


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
def on_child_pod_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    if not RUNTIME.terminal((namespace, labels[LABEL_JOB])):
        reconcile_by_name(namespace, labels[LABEL_JOB])


@kopf.on.event(API_GROUP, API_VERSION, "gpunodepools")
def on_pool_event(**_: Any) -> None:
    if RUNTIME.api is not None:
        try:
            reconcile_pools(RUNTIME.api, nodes=RUNTIME.world.nodes(RUNTIME.api))
        except Exception:
            metrics.RECONCILE_ERRORS.labels("GPUNodePool").inc()
            log.exception("pool status update failed")


def resync_forever(interval_seconds: float) -> None:
    """Re-reconcile unfinished jobs and the pools: capacity timeouts, missed events, crashes.

    A job that an event reconciled within the interval is skipped, and the listed body is used
    instead of a second read (a stale one only costs a 409 and the next pass)."""
    while not RUNTIME.stop.wait(interval_seconds):
        api = RUNTIME.api
        if api is None:
            continue
        try:
            reconcile_pools(api, nodes=RUNTIME.world.nodes(api))
            for ns in RUNTIME.settings.namespaces or (None,):
                for item in api.list_motjs(ns):
                    meta = item["metadata"]
                    key = (meta["namespace"], meta["name"])
                    if (item.get("status") or {}).get("phase") in TERMINAL:
                        continue
                    if RUNTIME.reconciled_within(key, interval_seconds):
                        continue
                    reconcile_by_name(*key, body=item)
        except Exception:
            metrics.RECONCILE_ERRORS.labels("Resync").inc()
            log.exception("resync failed")

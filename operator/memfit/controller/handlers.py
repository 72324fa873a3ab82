"""kopf wiring: MOTJ and child Job events queue the job; worker threads run the one reconcile; a
resync loop covers timeouts and missed events.

Only `@kopf.on.event` handlers are used: kopf then stores no progress or diff-base annotations and
adds no finalizers, so deleting a job never waits for the operator (owner GC removes children).
The event handlers only put the job's key on a de-duplicating work queue (workqueue.py): an event
storm costs one reconcile per job, and no event body waits in memory for a free thread.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from memfit import metrics
from memfit.api.common import API_GROUP, API_VERSION
from memfit.controller.events import EventPoster
from memfit.controller.kubeapi import MOTJ_PLURAL, ForeignObjectError, KubeApi
from memfit.controller.pool_status import reconcile_pools
from memfit.controller.reconcile import reconcile_job
from memfit.controller.settings import OperatorSettings
from memfit.controller.workqueue import Key, WorkQueue
from memfit.controller.world import WorldCache
from memfit.kube.names import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("memfit.operator")

TERMINAL = ("Succeeded", "Failed")
REPLANS = ("OutOfMemory", "NoCapacity")  # attempt outcomes the next pass re-plans
CHILD_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}"  # only memfit's Jobs, not the cluster's


class Runtime:
    """Process-wide state of the operator: settings, API clients, the shared world snapshot, the work
    queue, and what the last reconcile of each job left (its phase, the resourceVersion it wrote)."""

    def __init__(self) -> None:
        self.settings = OperatorSettings()
        self.api: KubeApi | None = None
        self.world = WorldCache()
        self.queue = WorkQueue()
        self.events = EventPoster()
        self.healthy = threading.Event()
        self.stop = threading.Event()
        self._guard = threading.Lock()
        self._written: dict[Key, str] = {}  # resourceVersion our last status patch made
        self._terminal: set[Key] = set()

    def note(self, key: Key, *, phase: str, written: str) -> None:
        """Remember the job's phase and the resourceVersion of our status patch (if any)."""
        with self._guard:
            if written:
                self._written[key] = written
            if phase in TERMINAL:
                self._terminal.add(key)
            else:
                self._terminal.discard(key)

    def own_write(self, key: Key, resource_version: str) -> bool:
        """The MOTJ event shows exactly what our last status patch wrote: nothing new to reconcile."""
        with self._guard:
            return bool(resource_version) and self._written.get(key) == resource_version

    def terminal(self, key: Key) -> bool:
        """Known Succeeded/Failed: a child's event cannot change anything any more."""
        with self._guard:
            return key in self._terminal

    def forget(self, key: Key) -> None:
        with self._guard:
            self._written.pop(key, None)
            self._terminal.discard(key)
        self.queue.forget(key)


RUNTIME = Runtime()


def reconcile_by_name(namespace: str, name: str) -> None:
    """Reconcile one job now, in this thread (the workers do this for queued jobs)."""
    if RUNTIME.api is not None:
        _reconcile_once(RUNTIME.api, namespace, name)


def work_forever() -> None:
    """A worker: take a job from the queue, reconcile it, and queue it again when a re-plan is due."""
    while not RUNTIME.stop.is_set():
        key = RUNTIME.queue.get(timeout=1.0)
        if key is None or RUNTIME.api is None:
            continue
        try:
            followup = _reconcile_once(RUNTIME.api, *key)
        finally:
            RUNTIME.queue.done(key)
        if followup:
            RUNTIME.queue.add(key)


def start_workers(count: int) -> list[threading.Thread]:
    threads = [
        threading.Thread(target=work_forever, name=f"memfit-worker-{i}", daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def _reconcile_once(api: KubeApi, namespace: str, name: str) -> bool:
    """One reconcile pass; errors are logged and counted, never crash the operator. True when it
    stored a finished attempt whose re-plan should run now (the event of our own status patch is
    skipped, so nothing else would trigger it before the resync)."""
    try:
        body = api.get_motj(namespace, name)
        if body is None:
            metrics.JOBS.forget(namespace, name)
            RUNTIME.forget((namespace, name))
            return False
        started = time.perf_counter()
        decision = reconcile_job(
            api,
            body,
            settings=RUNTIME.settings,
            world_source=RUNTIME.world.source(api),
            post_event=RUNTIME.events.post,
        )
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
    except TransportError as error:  # API server unreachable (restart, network): the resync retries
        metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
        log.warning("reconcile %s/%s: API server unreachable (%s)", namespace, name, type(error).__name__)
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
    settings.execution.max_workers = 2  # only the pool handler is synchronous; jobs go to our workers
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.label_selectors["batch", "jobs"] = CHILD_SELECTOR
    RUNTIME.world = WorldCache(RUNTIME.settings.world_ttl_seconds, RUNTIME.settings.node_ttl_seconds)
    # kopf logs "Handler ... succeeded" for every event (10 per job); memfit logs its own decisions.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if RUNTIME.api is not None:
        RUNTIME.events.start(RUNTIME.api)
    start_workers(RUNTIME.settings.workers)
    RUNTIME.healthy.set()


@kopf.on.cleanup()
def on_operator_cleanup(**_: Any) -> None:
    RUNTIME.stop.set()
    RUNTIME.queue.close()
    RUNTIME.events.stop()
    RUNTIME.healthy.clear()


@kopf.on.event(API_GROUP, API_VERSION, MOTJ_PLURAL)
async def on_motj_event(event: dict[str, Any], meta: Any, namespace: str, name: str, **_: Any) -> None:
    key = (namespace, name)
    if event.get("type") == "DELETED":
        metrics.JOBS.forget(namespace, name)
        RUNTIME.forget(key)
        return
    if RUNTIME.own_write(key, str(meta.get("resourceVersion", ""))):
        return  # the echo of our own status patch: that reconcile already saw this state
    RUNTIME.queue.add(key)


# Child Jobs, not their Pods: the Job controller reflects every pod change that matters (created,
# ready, succeeded, failed, OOM via podFailurePolicy) in the Job's status, so pod events only
# repeated them (about half of all events). A pod that stays Unschedulable changes nothing; the
# resync loop times it out. The watch is filtered server-side (CHILD_SELECTOR), not in kopf.
@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
async def on_child_job_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    job = labels[LABEL_JOB]
    if not RUNTIME.terminal((namespace, job)):  # a finished job never changes again
        RUNTIME.queue.add((namespace, job))


@kopf.on.event(API_GROUP, API_VERSION, "gpunodepools")
def on_pool_event(**_: Any) -> None:
    RUNTIME.world.invalidate()  # a pool was added, changed or removed: the next plan sees it
    if RUNTIME.api is not None:
        try:
            reconcile_pools(RUNTIME.api, nodes=RUNTIME.world.nodes(RUNTIME.api))
        except TransportError as error:
            metrics.RECONCILE_ERRORS.labels("GPUNodePool").inc()
            log.warning("pool status: API server unreachable (%s)", type(error).__name__)
        except Exception:
            metrics.RECONCILE_ERRORS.labels("GPUNodePool").inc()
            log.exception("pool status update failed")


def resync_forever(interval_seconds: float) -> None:
    """Queue every unfinished job that nothing reconciled within the interval, and update the pools:
    capacity timeouts, missed events, crashes."""
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
                    if not RUNTIME.queue.busy_within(key, interval_seconds):
                        RUNTIME.queue.add(key)
        except TransportError as error:
            metrics.RECONCILE_ERRORS.labels("Resync").inc()
            log.warning(
                "resync: API server unreachable (%s); next try in %ss", type(error).__name__, interval_seconds
            )
        except Exception:
            metrics.RECONCILE_ERRORS.labels("Resync").inc()
            log.exception("resync failed")

"""kopf wiring: MOTJ and child Job events queue the job; worker threads run the one reconcile; a
resync loop covers timeouts and missed events.

Only `@kopf.on.event` handlers are used: kopf then stores no progress or diff-base annotations and
adds no finalizers, so deleting a job never waits for the operator (owner GC removes children).
The event handlers only put the job's key on a de-duplicating work queue (workqueue.py): an event
storm costs one reconcile per job, and no event body waits in memory for a free thread.

The process-wide `Runtime` is made by the caller (`memfit operator`, tests) and handed to kopf as the
operator's memo (`kopf.run(memo=runtime_memo(runtime))`): handlers get it as `memo.runtime`, the worker
and resync threads as an argument. No module global holds it.
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
from memfit.api.job import AttemptOutcome, Phase
from memfit.controller.events import EventPoster
from memfit.controller.kept_profiles import KeptProfiles
from memfit.controller.kubeapi import MOTJ_PLURAL, ForeignObjectError, KubeApi
from memfit.controller.pool_status import reconcile_pools
from memfit.controller.reconcile import RecordConflict, reconcile_job
from memfit.controller.settings import OperatorSettings
from memfit.controller.settled_pods import SettledPods
from memfit.controller.watched_jobs import WatchedJobs, older
from memfit.controller.workqueue import Key, WorkQueue
from memfit.controller.world_cache import WorldCache
from memfit.kube.names import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from memfit.lifecycle import Decision

log = logging.getLogger("memfit.operator")

TERMINAL = (Phase.SUCCEEDED, Phase.FAILED)
ROUTINE_PHASES = frozenset({Phase.LAUNCHING, Phase.RUNNING, *TERMINAL})
# Workers that also take routine passes (a launched job's status refresh); the others launch and re-plan
# only. 16 is the worker count the paced runs of benchmarks/scale.py met their CPU target with.
ROUTINE_WORKERS = 16
# A routine pass waits this long in the queue, so that the status changes a running job's Job sends in a
# row (pods created, scheduled, running, finished) are one pass, not one each (controller.workqueue).
ROUTINE_MIN_WAIT_SECONDS = 1.0
CHILD_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}"  # only memfit's Jobs, not the cluster's
# The longest a job goes without a look when nothing it watches changes (a missed event is found then).
MAX_RECHECK_SECONDS = 60.0
# The resync reads every MOTJ's name from the API server this often (also right after start); between
# these full lists it walks the jobs the watch showed. A full list, even as metadata, decoded every
# resync interval was a seventh of the operator's CPU at 1,000 jobs (benchmarks/scale.py).
FULL_LIST_SECONDS = 60.0


class Runtime:
    """Process-wide state of the operator: settings, API clients, the shared world snapshot, the work
    queue, and what the last reconcile of each job left (its phase, the resourceVersion it wrote)."""

    def __init__(self, settings: OperatorSettings | None = None, api: KubeApi | None = None) -> None:
        self.settings = settings or OperatorSettings()
        self.jobs = WatchedJobs()  # memfit's Jobs as the watch showed them: a pass reads them from here
        self.api = api
        self.pods = SettledPods()  # settled pod lists of memfit's Jobs, reused while the Job is unchanged
        self.profiles = KeptProfiles()  # profile caches read lately, parsed, forgotten on our own write
        if api is not None:
            api.watched_jobs = self.jobs
            api.settled_pods = self.pods
            api.kept_profiles = self.profiles
        self.world = WorldCache(self.settings.world_ttl_seconds, self.settings.node_ttl_seconds)
        self.queue = WorkQueue(routine_min_wait=ROUTINE_MIN_WAIT_SECONDS)
        self.events = EventPoster()
        self.healthy = threading.Event()
        self.stop = threading.Event()
        self._guard = threading.Lock()
        self._written: dict[Key, str] = {}  # resourceVersion our last status patch made
        self._terminal: set[Key] = set()
        self._known: set[Key] = set()  # every MOTJ the watch showed (the resync's list between full lists)
        self._recheck_at: dict[Key, float] = {}  # monotonic time of a job's next look (Decision.recheck_after)
        self._phase: dict[Key, str] = {}  # the phase the last reconcile left
        # The newest MOTJ body seen (watch event or our own status patch's answer): a reconcile starts from
        # it instead of a GET. Only this operator writes the status, and every status patch is guarded by
        # the resourceVersion, so a body older than the stored one fails its patch (409): then it is
        # dropped and the next pass reads the job from the API server.
        self._bodies: dict[Key, dict[str, Any]] = {}

    def note(
        self, key: Key, *, phase: str, written: str, settled: bool = True, recheck_after: float | None = None
    ) -> None:
        """Remember the job's phase and the resourceVersion of our status patch (if any). A finished job
        is known terminal (skipped by the resync) only once its decision asks for no further pass: a
        job that just failed is not, until the pass that gives its GPUs back went through. A decision
        that needs no look before `recheck_after` seconds (unless a watched object changes) is skipped
        by the resync until then."""
        with self._guard:
            self._known.add(key)
            self._phase[key] = phase
            if written:
                self._written[key] = written
            if phase in TERMINAL and settled:
                self._terminal.add(key)
            else:
                self._terminal.discard(key)
            if recheck_after is None:
                self._recheck_at.pop(key, None)
            else:
                self._recheck_at[key] = time.monotonic() + min(recheck_after, MAX_RECHECK_SECONDS)

    def routine(self, key: Key) -> bool:
        """The job's training pods are launched or running (or it is finished): a pass for it refreshes
        its status, and waits behind jobs still to be launched or re-planned (workqueue.py)."""
        with self._guard:
            return self._phase.get(key) in ROUTINE_PHASES

    def remember(self, key: Key, body: dict[str, Any]) -> None:
        """Keep `body` as the job's newest known state unless a newer one is kept (managedFields dropped:
        the decision never reads them)."""
        meta = body.get("metadata") or {}
        slim = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        with self._guard:
            kept = self._bodies.get(key)
            if kept is None or not older(slim, kept):
                self._bodies[key] = slim

    def body(self, key: Key) -> dict[str, Any] | None:
        with self._guard:
            return self._bodies.get(key)

    def drop_body(self, key: Key) -> None:
        """The kept body proved stale (a 409 on the status patch): the next pass reads the job."""
        with self._guard:
            self._bodies.pop(key, None)

    def seen(self, key: Key) -> None:
        """The watch showed this MOTJ (created, changed, or listed after a restart)."""
        with self._guard:
            self._known.add(key)

    def known(self) -> list[Key]:
        with self._guard:
            return list(self._known)

    def recheck_due(self, key: Key) -> bool:
        """The resync may look at the job: its last decision asked for no later look."""
        with self._guard:
            at = self._recheck_at.get(key)
        return at is None or time.monotonic() >= at

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
            self._known.discard(key)
            self._recheck_at.pop(key, None)
            self._phase.pop(key, None)
            self._bodies.pop(key, None)
        self.queue.forget(key)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base for memfit, which registers only `@kopf.on.event` handlers: nothing compares
    an object's old and new essence, yet kopf builds it for every event by deep-copying the whole
    object (a tenth of the operator's CPU at 1,000 jobs, benchmarks/scale.py). So: an empty essence,
    nothing fetched, nothing stored."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """kopf's handler-progress storage for memfit: `@kopf.on.event` handlers keep no progress, yet kopf
    "clears" it from every event's essence (a deep copy each time: a twentieth of the operator's CPU in
    a burst of 1,000 jobs, benchmarks/scale.py). So: nothing fetched, stored or cleared."""

    def fetch(self, *, key: Any, body: kopf.Body) -> None:
        return None

    def store(self, *, key: Any, record: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        return None

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        return essence


def runtime_memo(runtime: Runtime) -> kopf.Memo:
    """The memo to pass to `kopf.run`: kopf hands each handler a shallow copy, so the Runtime inside
    stays one shared object."""
    return kopf.Memo(runtime=runtime)


def reconcile_by_name(runtime: Runtime, namespace: str, name: str) -> None:
    """Reconcile one job now, in this thread (the workers do this for queued jobs)."""
    if runtime.api is not None:
        _reconcile_once(runtime, runtime.api, namespace, name)


def work_forever(runtime: Runtime, *, urgent_only: bool = False) -> None:
    """A worker: take a job from the queue, reconcile it, and queue it again when a re-plan is due.
    `urgent_only`: only passes that launch or re-plan (controller.workqueue)."""
    while not runtime.stop.is_set():
        # No timeout: an idle worker sleeps until a key comes or the queue closes (64 workers waking
        # every second to look again cost CPU for nothing).
        key = runtime.queue.get(urgent_only=urgent_only)
        if key is None:
            return  # the queue closed: the operator stops
        if runtime.api is None:
            runtime.queue.done(key)
            continue
        try:
            followup = _reconcile_once(runtime, runtime.api, *key)
        finally:
            runtime.queue.done(key)
        if followup:
            runtime.queue.add(key)


def start_workers(runtime: Runtime, count: int, *, routine: int = ROUTINE_WORKERS) -> list[threading.Thread]:
    """`count` workers, of which `routine` also take routine passes (the rest only urgent ones)."""
    threads = [
        threading.Thread(target=work_forever, args=(runtime,), kwargs={"urgent_only": i >= routine},
                         name=f"memfit-worker-{i}", daemon=True)
        for i in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def _reconcile_once(runtime: Runtime, api: KubeApi, namespace: str, name: str) -> bool:
    """One reconcile pass; errors are logged and counted, never crash the operator. True when the
    decision asks for another pass now (a re-plan, or releasing a failed job's GPUs): the event of our
    own status patch is skipped, so nothing else would trigger it before the resync."""
    key = (namespace, name)
    try:
        body = runtime.body(key) or api.get_motj(namespace, name)
        if body is None:
            metrics.JOBS.forget(namespace, name)
            runtime.forget((namespace, name))
            return False
        started = time.perf_counter()
        decisions: list[Decision] = []
        applied = reconcile_job(
            api,
            body,
            settings=runtime.settings,
            world_source=runtime.world.source(api),
            post_event=runtime.events.post,
            decided=decisions.append,
        )
        (decision,) = decisions
        status = applied.status if applied else (body.get("status") or {})
        written = applied.resource_version if applied else ""
        settled = not decision.requeue
        runtime.note(
            (namespace, name), phase=str(status.get("phase", "")), written=written, settled=settled,
            recheck_after=decision.recheck_after,
        )
        if applied is not None and applied.stored:
            runtime.remember(key, applied.stored)
        metrics.JOBS.observe(metrics.JobSnapshot.from_status(namespace, name, status))
        if applied:
            _count(namespace, applied.decision)
            if AttemptOutcome.RANK_DISRUPTED in applied.decision.replans:
                runtime.world.invalidate(nodes=True)  # the re-plan reads the Nodes left (cordoned, gone)
            log.debug("reconciled %s/%s in %.3fs", namespace, name, time.perf_counter() - started)
        return applied is not None and decision.requeue
    except ApiException as error:
        if error.status == 409:  # a concurrent write, or a stale kept body: the next event or resync reads it
            runtime.drop_body(key)
            return False
        if error.status == 404:  # deleted after the body was kept (its DELETED event forgets it too)
            runtime.drop_body(key)
            return False
        metrics.RECONCILE_ERRORS.labels("MemoryOptimizedTrainingJob").inc()
        log.warning("reconcile %s/%s: API error %s %s", namespace, name, error.status, error.reason)
    except RecordConflict as error:  # the snapshot predates a recorded plan: the next pass reads it
        log.info("reconcile %s/%s: %s", namespace, name, error)
        return True
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


def _count(namespace: str, decision: Decision) -> None:
    """The counters the decision says to record (a stored decision: its status patch went through)."""
    for outcome in decision.replans:
        metrics.REPLANS.labels(namespace, outcome).inc()
    if decision.profiling_failed:
        metrics.PROFILING_FAILURES.labels(namespace).inc()


@kopf.on.startup()
def on_operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    settings.persistence.progress_storage = NoProgress()
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 2  # only the pool handler is synchronous; jobs go to our workers
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.label_selectors["batch", "jobs"] = CHILD_SELECTOR
    # kopf logs "Handler ... succeeded" for every event (10 per job); memfit logs its own decisions.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if runtime.api is not None:
        runtime.events.start(runtime.api)
    start_workers(runtime, runtime.settings.workers)
    runtime.healthy.set()


@kopf.on.cleanup()
def on_operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    runtime.stop.set()
    runtime.queue.close()
    runtime.events.stop()
    runtime.healthy.clear()


@kopf.on.event(API_GROUP, API_VERSION, MOTJ_PLURAL)
async def on_motj_event(
    event: dict[str, Any], meta: Any, namespace: str, name: str, memo: kopf.Memo, **_: Any
) -> None:
    runtime: Runtime = memo.runtime
    key = (namespace, name)
    if event.get("type") == "DELETED":
        metrics.JOBS.forget(namespace, name)
        runtime.forget(key)
        return
    runtime.seen(key)
    if isinstance(event.get("object"), dict):
        runtime.remember(key, event["object"])
    if runtime.own_write(key, str(meta.get("resourceVersion", ""))):
        return  # the echo of our own status patch: that reconcile already saw this state
    runtime.queue.add(key)


# Child Jobs, not their Pods: the Job controller reflects every pod change that matters (created,
# ready, succeeded, failed, OOM via podFailurePolicy) in the Job's status, so pod events only
# repeated them (about half of all events). A pod that stays Unschedulable changes nothing; the
# resync loop times it out. The watch is filtered server-side (CHILD_SELECTOR), not in kopf.
@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
async def on_child_job_event(
    event: dict[str, Any], labels: dict[str, str], namespace: str, name: str, memo: kopf.Memo, **_: Any
) -> None:
    runtime: Runtime = memo.runtime
    if event.get("type") == "DELETED":
        runtime.jobs.gone(namespace, name)
    elif isinstance(event.get("object"), dict) and not runtime.jobs.seen(event["object"]):
        return  # the echo of the Job as our own create left it: the pass that created it saw this
    job = labels[LABEL_JOB]
    key = (namespace, job)
    if not runtime.terminal(key):  # a finished job never changes again
        runtime.queue.add(key, urgent=not runtime.routine(key))


@kopf.on.event(API_GROUP, API_VERSION, "gpunodepools")
def on_pool_event(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime = memo.runtime
    runtime.world.invalidate()  # a pool was added, changed or removed: the next plan sees it
    if runtime.api is not None:
        try:
            reconcile_pools(runtime.api, nodes=runtime.world.nodes(runtime.api))
        except TransportError as error:
            metrics.RECONCILE_ERRORS.labels("GPUNodePool").inc()
            log.warning("pool status: API server unreachable (%s)", type(error).__name__)
        except Exception:
            metrics.RECONCILE_ERRORS.labels("GPUNodePool").inc()
            log.exception("pool status update failed")


def resync_forever(runtime: Runtime, interval_seconds: float, full_list_seconds: float = FULL_LIST_SECONDS) -> None:
    """Queue every unfinished job that nothing reconciled within the interval and whose last decision
    asked for no later look, and update the pools: capacity timeouts, missed events, crashes.

    The jobs are read from the API server (metadata only) at start and every `full_list_seconds`;
    between two full lists, the jobs the watch showed."""
    listed_at: float | None = None
    while not runtime.stop.wait(interval_seconds):
        api = runtime.api
        if api is None:
            continue
        try:
            reconcile_pools(api, nodes=runtime.world.nodes(api))
            full = listed_at is None or time.monotonic() - listed_at >= full_list_seconds
            keys: list[Key] = []
            if full:
                for ns in runtime.settings.namespaces or (None,):
                    keys.extend(api.list_motj_keys(ns))
                listed_at = time.monotonic()
                for gone in set(runtime.known()) - set(keys):  # deleted while the watch was away
                    runtime.drop_body(gone)  # its next pass reads it from the API server, finds none, forgets it
                    runtime.queue.add(gone)
            for key in keys or runtime.known():
                if runtime.terminal(key):
                    continue
                if full:
                    runtime.seen(key)
                # A job this process saw finish is skipped; one it has not seen yet (after a restart) is
                # reconciled once, which reads its phase.
                if runtime.recheck_due(key) and not runtime.queue.busy_within(key, interval_seconds):
                    runtime.queue.add(key, urgent=not runtime.routine(key))
        except TransportError as error:
            metrics.RECONCILE_ERRORS.labels("Resync").inc()
            log.warning(
                "resync: API server unreachable (%s); next try in %ss", type(error).__name__, interval_seconds
            )
        except Exception:
            metrics.RECONCILE_ERRORS.labels("Resync").inc()
            log.exception("resync failed")

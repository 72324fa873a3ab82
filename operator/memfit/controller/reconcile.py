"""The one level-triggered reconcile of a MemoryOptimizedTrainingJob: read, decide, apply, patch.

create, resume, update, timers and child events all call `reconcile_job`: it reads a snapshot of the
job and its children (controller.snapshot), lets `lifecycle.decide` take the decision (pure), ensures
and deletes children in the decision's order (deterministic names, 409 with our owner = already
done), and patches the status only when it changed, then posts the events. Running it twice in a row
writes nothing the second time; a crash after any write ends like the clean run (docs/reliability.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from memfit import metrics
from memfit.api.job import MemoryOptimizedTrainingJobStatus
from memfit.controller.events import event_manifest
from memfit.controller.kubeapi import KubeApi
from memfit.controller.read_snapshot import observe_snapshot
from memfit.controller.settings import OperatorSettings
from memfit.kube.train_job import PLAN_KEY
from memfit.lifecycle import Decision, Delete, Effect, Ensure, Event, World, WriteData, decide
from memfit.lifecycle.result import PostEvent, SetAdmissionCheck

log = logging.getLogger(__name__)

Manifest = dict[str, Any]


class RecordConflict(RuntimeError):
    """A decision record (plan ConfigMap) already holds another decision: the next reconcile reads it."""


@dataclass
class Applied:
    """What one reconcile persisted: the decision, its status as stored, and its events."""

    decision: Decision
    resource_version: str = ""  # of the MOTJ after the status patch (its watch event is our own write)
    status: Manifest = field(default_factory=dict)  # wire form (camelCase), as patched
    stored: Manifest = field(default_factory=dict)  # the whole MOTJ as the status patch left it

    @property
    def events(self) -> list[tuple[str, str, str]]:
        return [(e.type.value, e.reason, e.message) for e in self.decision.events]


def reconcile_job(
    api: KubeApi,
    body: Manifest,
    *,
    settings: OperatorSettings,
    world: World | None = None,
    world_source: Callable[[], World] | None = None,
    post_event: Callable[[Manifest], None] | None = None,
    now: datetime | None = None,
    decided: Callable[[Decision], None] | None = None,
) -> Applied | None:
    """Reconcile one MOTJ; returns what it persisted, or None when nothing changed.

    The pools come from `world`, else from `world_source` (the operator's shared snapshot), else from
    the API server; only the steps that plan or place pods read them. Events go to `post_event` (the
    operator's background poster), else straight to the API server. `decided` is handed the decision
    also when it changes nothing (the operator schedules the job's next look from it:
    `Decision.recheck_after`)."""
    snap = observe_snapshot(api, body, settings=settings, world=world, world_source=world_source, now=now)
    decision = decide(snap, timer=metrics.PLAN_SECONDS.time)
    if decided is not None:
        decided(decision)
    apply_writes(api, snap.job.namespace, decision.effects, post_event=post_event)
    if decision.profile_seconds is not None:
        metrics.PROFILE_SECONDS.observe(decision.profile_seconds)  # the profiler's own wall time
    if decision.status == snap.status and body.get("status"):
        return None
    meta = body["metadata"]
    wire = decision.status.to_wire()
    patch = with_deletions(body.get("status") or {}, wire)
    patched = api.patch_motj_status(meta["namespace"], meta["name"], patch, meta["resourceVersion"])
    applied = Applied(decision, str((patched.get("metadata") or {}).get("resourceVersion", "")), wire, patched)
    for event in decision.events:
        _post_event(api, body, event, now=snap.now, post=post_event)
    return applied


STATUS_KEYS = frozenset(
    field.alias or name for name, field in MemoryOptimizedTrainingJobStatus.model_fields.items()
)


def with_deletions(stored: Manifest, wire: Manifest, *, top: bool = True) -> Manifest:
    """The merge patch from the stored status to `wire`: a key the new status no longer has (a field
    now None, e.g. progress.loss before a resumed pod's first step) is sent as null, which deletes it;
    otherwise the stored value would stay. Only keys of our own status model are touched."""
    patch: Manifest = dict(wire)
    for key, old in stored.items():
        if top and key not in STATUS_KEYS:
            continue
        if key not in wire:
            patch[key] = None
        elif isinstance(old, dict) and isinstance(wire[key], dict):
            patch[key] = with_deletions(old, wire[key], top=False)
    return patch


def apply_writes(
    api: KubeApi, namespace: str, effects: Sequence[Effect], *, post_event: Callable[[Manifest], None] | None = None
) -> None:
    """Make the writes of a decision (a MOTJ's, or an AdmissionCheck's: lifecycle.admission), in order."""
    for effect in effects:
        if isinstance(effect, SetAdmissionCheck):
            api.apply_workload_check(effect.namespace, effect.workload, {
                "name": effect.check, "state": effect.state, "message": effect.message,
                "lastTransitionTime": effect.now})
        elif isinstance(effect, PostEvent):
            manifest = event_manifest(effect.involved, reason=effect.reason, message=effect.message,
                                      type_=effect.type.value, now=datetime.now(UTC))
            try:
                (post_event or api.create_event)(manifest)
            except Exception as error:  # an Event never fails the decision
                log.warning("could not post event %s for %s: %s", effect.reason, effect.involved.get("name"), error)
        elif isinstance(effect, Ensure):
            stored, created = api.ensure(effect.manifest)
            wanted = effect.manifest.get("data", {}).get(PLAN_KEY)
            if effect.record and not created and stored.get("data", {}).get(PLAN_KEY) != wanted:
                raise RecordConflict(
                    f"ConfigMap {namespace}/{effect.manifest['metadata']['name']} holds another plan"
                )
        elif isinstance(effect, Delete):
            api.delete_job(namespace, effect.name)
        elif isinstance(effect, WriteData):
            name = effect.manifest["metadata"]["name"]
            if not effect.exists:
                _, created = api.ensure(effect.manifest)
                if created:
                    continue
            api.replace_config_map_data(namespace, name, effect.manifest["data"])


def _post_event(
    api: KubeApi,
    body: Manifest,
    event: Event,
    *,
    now: datetime,
    post: Callable[[Manifest], None] | None = None,
) -> None:
    meta = body["metadata"]
    involved = {
        "apiVersion": body.get("apiVersion", "memfit.dev/v1alpha1"),
        "kind": body.get("kind", "MemoryOptimizedTrainingJob"),
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
    }
    manifest = event_manifest(involved, reason=event.reason, message=event.message, type_=event.type.value, now=now)
    try:
        (post or api.create_event)(manifest)
    except Exception as error:  # events are best effort; never fail a reconcile over one
        log.warning(
            "could not post event %s for %s/%s: %s", event.reason, meta["namespace"], meta["name"], error
        )

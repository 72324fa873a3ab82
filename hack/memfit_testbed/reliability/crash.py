"""Crash campaign: MOTJ lifecycles while `memfit operator` is SIGKILLed at random points and restarted.

Lifecycles (pods simulated by the chaos KWOK stages, so each takes seconds):
- `plain`: cached profile -> plan -> train -> Succeeded.
- `profiled`: `profiling.reuse: false` -> profiling Job (simulated profiler) -> plan -> train -> Succeeded.
- `oom-once`: the first attempt runs out of memory -> re-plan -> Succeeded (outcomes OOM, Succeeded).
- `oom-exhausted`: every attempt runs out of memory, maxReplans 1 -> Failed ReplansExhausted.
- `long`: the trainer runs until the harness ends it, 2-12 s after it started -> Succeeded (kills
  land in the monitoring of a running job, not only in launches).
- `deleted`: deleted at a random moment -> garbage collection removes every child.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability.chaos import (
    GROUP,
    MOTJ,
    VERSION,
    ChaosCluster,
    OperatorProcess,
    quickstart,
)
from memfit_testbed.reliability.fault_kit import finish_pods
from memfit_testbed.reliability.invariants import TERMINAL, JobRecorder, Report, check_world, leftovers

KINDS = ("plain", "long", "profiled", "oom-once", "oom-exhausted", "deleted", "long", "plain")
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "plain": ("Succeeded", ["Succeeded"]),
    "profiled": ("Succeeded", ["Succeeded"]),
    "oom-once": ("Succeeded", ["OutOfMemory", "Succeeded"]),
    "oom-exhausted": ("Failed", ["OutOfMemory", "OutOfMemory"]),
    "long": ("Succeeded", ["Succeeded"]),
}
OOM = {"memfit.dev/inject-oom-at-step": "3"}
ROOMY_POOLS = {"t4-spot": 8, "l4-ondemand": 4, "a100-80-ondemand": 2}  # capacity never the question


def lifecycle_doc(kind: str, index: int) -> dict[str, Any]:
    """The MOTJ of one lifecycle; OOM lifecycles get their own problem so their learning stays private."""
    name = f"{kind}-{index:03d}"  # `long-*` jobs' trainers run until finish_pods (chaos stages)
    recovery = {"maxReplans": 3, "capacityTimeoutSeconds": 600}
    if kind == "profiled":
        return quickstart(name, profiling={"reuse": False, "timeoutSeconds": 600}, recovery=recovery)
    if kind.startswith("oom"):
        problem = {"builtin": {**quickstart(name)["spec"]["problem"]["builtin"], "vocab": 1000 + index}}
        if kind == "oom-once":
            return quickstart(name, annotations=OOM, problem=problem, recovery=recovery)
        always = OOM | {"memfit.dev/inject-oom-attempts": "99"}
        return quickstart(name, annotations=always, problem=problem, recovery=recovery | {"maxReplans": 1})
    return quickstart(name, recovery=recovery)


def make_roomy(cc: ChaosCluster) -> None:
    """Grow the KWOK pools (and their GPUNodePools) so no lifecycle waits for capacity."""
    from memfit_testbed import kwok_pools

    pools = kwok_pools.load_pools()
    custom = client.CustomObjectsApi(cc.kube.api_client)
    for name, nodes in ROOMY_POOLS.items():
        kwok_pools.scale_pool(cc.kube.core, pools[name], nodes)
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "gpunodepools", name, {"spec": {"maxNodes": nodes}}
        )


@dataclass
class Campaign:
    """Settings of one crash campaign."""

    lifecycles: int = 50
    kills: int = 100
    min_uptime: float = 0.2  # seconds from spawn to SIGKILL, uniform in [min, max]
    max_uptime: float = 5.0
    settle_seconds: float = 180.0  # bound for "stuck": every job terminal this long after the last kill
    seed: int = 8


@dataclass
class CampaignResult:
    report: Report
    kills: int
    kills_with_jobs_in_flight: int
    kills_after_healthy: int
    operator_starts: int
    operator_crashes: list[int]
    operator_logged_errors: int
    leftovers_after_delete: list[str]
    deleted_jobs: int
    seconds: float
    settle_seconds: float
    lifecycle_seconds_max: float
    recorder_reconnects: int
    kinds: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "lifecycles": sum(self.kinds.values()),
            "kinds": self.kinds,
            "sigkills": self.kills,
            "sigkills_with_jobs_in_flight": self.kills_with_jobs_in_flight,
            "sigkills_after_operator_healthy": self.kills_after_healthy,
            "operator_starts": self.operator_starts,
            "operator_crashes": len(self.operator_crashes),
            "operator_logged_errors": self.operator_logged_errors,
            "deleted_mid_flight": self.deleted_jobs,
            "orphans_after_delete": len(self.leftovers_after_delete),
            "seconds": round(self.seconds, 1),
            "settle_seconds_after_last_kill": round(self.settle_seconds, 1),
            "lifecycle_seconds_max": round(self.lifecycle_seconds_max, 1),
            **self.report.summary(),
        }


def _phases(custom: Any, namespace: str) -> dict[str, str]:
    items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ)["items"]
    return {i["metadata"]["name"]: (i.get("status") or {}).get("phase", "") for i in items}


def run_campaign(cc: ChaosCluster, namespace: str, settings: Campaign, log_dir: Path) -> CampaignResult:
    """Create the lifecycles spread over the kill window, SIGKILL and restart the operator, then check."""
    rng = random.Random(settings.seed)
    custom = client.CustomObjectsApi(cc.kube.api_client)
    make_roomy(cc)
    kinds = [KINDS[i % len(KINDS)] for i in range(settings.lifecycles)]
    rng.shuffle(kinds)
    docs = [lifecycle_doc(kind, i) for i, kind in enumerate(kinds)]
    for doc in docs:
        seed_profile(cc.api, namespace, doc)
    expected = {d["metadata"]["name"]: EXPECTED[k] for d, k in zip(docs, kinds, strict=True) if k in EXPECTED}
    recorder = JobRecorder(cc.kube, namespace).start()
    op = OperatorProcess(cc.kubeconfig, log_dir / "operator-crash.log", namespaces=(namespace,))
    mean_cycle = (settings.min_uptime + settings.max_uptime) / 2 + 0.3
    window = max(settings.kills * mean_cycle, 1.0)
    create_at = [window * i / settings.lifecycles for i in range(settings.lifecycles)]
    delete_at: dict[str, float] = {}
    created: dict[str, float] = {}
    finished: dict[str, float] = {}
    finish_at: dict[str, float] = {}  # long jobs: when the harness ends their trainer
    in_flight_kills = healthy_kills = deleted = 0
    t0 = time.monotonic()
    op.start()
    next_kill = time.monotonic() + rng.uniform(settings.min_uptime, settings.max_uptime)
    was_healthy = False
    last_note = 0.0
    while op.kills < settings.kills or len(created) < len(docs):
        now = time.monotonic() - t0
        for doc, kind, at in zip(docs, kinds, create_at, strict=True):
            name = doc["metadata"]["name"]
            if name not in created and now >= at:
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, doc)
                created[name] = time.monotonic()
                if kind == "deleted":
                    delete_at[name] = time.monotonic() + rng.uniform(0.0, 8.0)
        for name, at in list(delete_at.items()):
            if time.monotonic() >= at:
                _delete(custom, namespace, name)
                del delete_at[name]
                deleted += 1
        was_healthy = was_healthy or (op.alive() and op.healthy())
        if time.monotonic() >= next_kill and op.kills < settings.kills:
            op.check_crash()
            phases = _phases(custom, namespace)
            in_flight = any(p not in TERMINAL for p in phases.values())
            op.kill()
            in_flight_kills += int(in_flight)
            healthy_kills += int(was_healthy)
            op.start()
            was_healthy = False
            next_kill = time.monotonic() + rng.uniform(settings.min_uptime, settings.max_uptime)
        if not op.alive():
            op.check_crash()
            op.start()
        if time.monotonic() - last_note > 0.5:
            _note_finished(custom, namespace, created, finished)
            _finish_long(cc, custom, namespace, finish_at, rng)
            last_note = time.monotonic()
        time.sleep(0.05)
    for name in list(delete_at):
        _delete(custom, namespace, name)
        deleted += 1
    last_kill = time.monotonic()
    op.wait_healthy()
    deadline = last_kill + settings.settle_seconds
    while time.monotonic() < deadline:
        _note_finished(custom, namespace, created, finished)
        _finish_long(cc, custom, namespace, finish_at, rng)
        if all(p in TERMINAL for p in _phases(custom, namespace).values()):
            break
        time.sleep(0.5)
    settle = time.monotonic() - last_kill
    report = check_world(cc.kube, namespace, recorder=recorder, expected=expected)
    op.check_crash()
    for name in _phases(custom, namespace):
        _delete(custom, namespace, name)
    left = _wait_gc(cc, namespace, 120.0)
    op.check_crash()
    op.stop()
    recorder.stop()
    spans = [finished[n] - created[n] for n in finished]
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return CampaignResult(
        report=report,
        kills=op.kills,
        kills_with_jobs_in_flight=in_flight_kills,
        kills_after_healthy=healthy_kills,
        operator_starts=op.starts,
        operator_crashes=op.crashes,
        operator_logged_errors=op.tracebacks(),
        leftovers_after_delete=left,
        deleted_jobs=deleted,
        seconds=time.monotonic() - t0,
        settle_seconds=settle,
        lifecycle_seconds_max=max(spans, default=0.0),
        recorder_reconnects=recorder.reconnects,
        kinds=counts,
    )


def _note_finished(
    custom: Any, namespace: str, created: dict[str, float], finished: dict[str, float]
) -> None:
    for name, phase in _phases(custom, namespace).items():
        if phase in TERMINAL and name in created and name not in finished:
            finished[name] = time.monotonic()


def _finish_long(
    cc: ChaosCluster, custom: Any, namespace: str, finish_at: dict[str, float], rng: random.Random
) -> None:
    """End the trainer of each running `long-*` job 2-12 s after it was first seen Running."""
    for name, phase in _phases(custom, namespace).items():
        if not name.startswith("long-") or phase != "Running":
            continue
        at = finish_at.setdefault(name, time.monotonic() + rng.uniform(2.0, 12.0))
        if time.monotonic() >= at:
            finish_pods(cc.kube, namespace, name)


def _delete(custom: Any, namespace: str, name: str) -> None:
    try:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, name)
    except ApiException as error:
        if error.status != 404:
            raise


def _wait_gc(cc: ChaosCluster, namespace: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    left = leftovers(cc.kube, namespace)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = leftovers(cc.kube, namespace)
    return left

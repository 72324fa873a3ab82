"""API server outages (issue 8 §2): kube-apiserver restarted while jobs run, etcd kept.

Jobs are in flight across every restart (long-running ones, and new ones created between restarts);
the operator process is never restarted. Every job must complete, once, with a consistent status.
A job is expected to succeed on its first attempt, unless its pool's nodes were not Ready while it
waited (node_readiness: back-to-back outages outlast the node controller's grace period): then a
NoCapacity re-plan first is the documented answer, and is counted as explained, not unexpected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from memfit.api.job import Attempt, AttemptOutcome

from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability.chaos import (
    GROUP,
    MOTJ,
    VERSION,
    ChaosCluster,
    OperatorProcess,
    quickstart,
)
from memfit_testbed.reliability.chaos_stages import LONG_RUN
from memfit_testbed.reliability.crash import make_roomy
from memfit_testbed.reliability.fault_kit import finish_pods
from memfit_testbed.reliability.invariants import TERMINAL, JobRecorder, Report, check_world
from memfit_testbed.reliability.node_readiness import NodeReadiness


@dataclass
class OutageResult:
    restarts: int
    downtime_seconds: list[float]
    jobs: int
    report: Report
    operator_restarted: bool
    operator_crashes: int
    operator_logged_errors: int
    settle_seconds: float
    recorder_reconnects: int
    nodes_not_ready: dict[str, list[list[str]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "apiserver_restarts": self.restarts,
            "api_down_seconds": [round(s, 1) for s in self.downtime_seconds],
            "jobs": self.jobs,
            "operator_process_restarted": self.operator_restarted,
            "operator_crashes": self.operator_crashes,
            "operator_logged_errors": self.operator_logged_errors,
            "settle_seconds_after_last_restart": round(self.settle_seconds, 1),
            "nodes_not_ready_utc": self.nodes_not_ready,
            **self.report.summary(),
        }


def _create(custom: Any, namespace: str, doc: dict[str, Any]) -> str:
    for _ in range(60):  # the API server may still be warming up after a restart
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, doc)
            return str(doc["metadata"]["name"])
        except client.exceptions.ApiException as error:
            if error.status == 409:
                return str(doc["metadata"]["name"])
            if error.status not in (429, 500, 503):
                raise
        except Exception:  # connection refused while it starts
            pass
        time.sleep(0.5)
    raise RuntimeError(f"could not create {doc['metadata']['name']}")


def run_restarts(
    cc: ChaosCluster,
    namespace: str,
    op: OperatorProcess,
    *,
    restarts: int = 5,
    downtime: float = 2.0,
    long_jobs: int = 4,
    jobs_between: int = 2,
    settle: float = 180.0,
) -> OutageResult:
    """Restart kube-apiserver `restarts` times (down `downtime` s each) with jobs in flight."""
    make_roomy(cc)
    custom = client.CustomObjectsApi(cc.kube.api_client)
    seed_profile(cc.api, namespace, quickstart("seed"))
    recorder = JobRecorder(cc.kube, namespace).start()
    readiness = NodeReadiness(cc.kube).start()
    expected: dict[str, tuple[str, list[str]]] = {}
    long_names = []
    for i in range(long_jobs):  # running through every restart; finished by the harness at the end
        name = _create(custom, namespace, quickstart(f"{LONG_RUN}outage-{i}"))
        long_names.append(name)
        expected[name] = ("Succeeded", ["Succeeded"])
    starts_before = op.starts
    downs: list[float] = []
    for r in range(restarts):
        time.sleep(3.0)
        downs.append(cc.cluster.restart_apiserver(downtime=downtime))
        for j in range(jobs_between):  # created right after the API server is back
            name = _create(custom, namespace, quickstart(f"after-restart-{r}-{j}"))
            expected[name] = ("Succeeded", ["Succeeded"])
    last = time.monotonic()
    deadline = last + settle
    while time.monotonic() < deadline:
        phases = {n: _phase(custom, namespace, n) for n in expected}
        for name in long_names:
            if phases[name] == "Running":
                finish_pods(cc.kube, namespace, name)
        if all(p in TERMINAL for p in phases.values()):
            break
        time.sleep(1.0)
    settle_seconds = time.monotonic() - last
    readiness.stop()
    report = check_world(cc.kube, namespace, recorder=recorder, expected=expected,
                         explain=lambda name, status: waited_on_unready_nodes(readiness, status))
    recorder.stop()
    op.check_crash()
    return OutageResult(
        restarts=len(downs),
        downtime_seconds=downs,
        jobs=len(expected),
        report=report,
        operator_restarted=op.starts != starts_before,
        operator_crashes=len(op.crashes),
        operator_logged_errors=op.tracebacks(),
        settle_seconds=settle_seconds,
        recorder_reconnects=recorder.reconnects,
        nodes_not_ready=readiness.summary(),
    )


def waited_on_unready_nodes(readiness: NodeReadiness, status: dict[str, Any]) -> str | None:
    """Why a job that succeeded after NoCapacity re-plans did so, when every such attempt waited while
    nodes of its pool were not Ready; None otherwise."""
    attempts = [Attempt.model_validate(a) for a in status.get("attempts") or []]
    capacity = [a for a in attempts if a.outcome == AttemptOutcome.NO_CAPACITY]
    if status.get("phase") != "Succeeded" or not capacity or len(capacity) != len(attempts) - 1:
        return None
    for a in capacity:
        if not (a.started_at and a.finished_at and readiness.disrupted(a.node_pool, a.started_at, a.finished_at)):
            return None
    pools = sorted({a.node_pool for a in capacity})
    return f"pool {', '.join(pools)} had nodes not Ready while the attempt waited (node controller, after the outages)"


def _phase(custom: Any, namespace: str, name: str) -> str:
    try:
        job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, name)
    except Exception:
        return ""
    return str((job.get("status") or {}).get("phase", ""))

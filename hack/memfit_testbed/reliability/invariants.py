"""What must hold after chaos: one training Job per attempt, nothing stuck, no orphans, status = children.

`JobRecorder` watches the namespace's batch Jobs for the whole run (reconnecting through API server
restarts) and remembers every UID each name ever had: a name with two UIDs is a duplicate launch.
`check_world` reads the final state and lists every violation with the job it concerns.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from memfit_testbed.cluster_helpers import Kube

GROUP, VERSION, MOTJ = "memfit.dev", "v1alpha1", "memoryoptimizedtrainingjobs"
TERMINAL = ("Succeeded", "Failed")
MANAGED = "app.kubernetes.io/managed-by=memfit"
PROFILE_CACHE = "profile-cache"
REPLANNED = ("OutOfMemory", "NoCapacity")
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


@dataclass
class JobRecorder:
    """Every (name -> UIDs) and the first time each training Job name was seen (monotonic seconds)."""

    kube: Kube
    namespace: str
    uids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    first_seen: dict[str, float] = field(default_factory=dict)
    reconnects: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> JobRecorder:
        self._thread = threading.Thread(target=self._run, name=f"jobs-{self.namespace}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=40)

    def _see(self, name: str, uid: str) -> None:
        with self._lock:
            self.uids[name].add(uid)
            self.first_seen.setdefault(name, time.monotonic())

    def _run(self) -> None:
        """List, then watch from the list's version, as metadata only and without the client's model
        classes: the recorder needs names and UIDs, and decoding every Job event into a V1Job cost the
        benchmark process a quarter of a core that the system under test shares (benchmarks/scale.py)."""
        batch = client.BatchV1Api(self.kube.api_client)
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listing = Kube.raw(batch.list_namespaced_job, self.namespace, _headers={"Accept": METADATA_LIST})
                    for job in (listing or {}).get("items") or []:
                        self._see(job["metadata"]["name"], job["metadata"]["uid"])
                    version = ((listing or {}).get("metadata") or {}).get("resourceVersion", "")
                stream = watch.Watch().stream(
                    batch.list_namespaced_job,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=5,
                    allow_watch_bookmarks=True,
                    deserialize=False,
                    _headers={"Accept": METADATA},
                )
                for event in stream:
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = ""
                        break
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._see(meta["name"], meta["uid"])
                    if self._stop.is_set():
                        break
            except ApiException as error:
                if error.status == 410:
                    version = ""
                self.reconnects += 1
                time.sleep(0.2)
            except Exception:  # API server down: connection refused/reset; re-list when it is back
                self.reconnects += 1
                version = ""
                time.sleep(0.2)

    def duplicates(self) -> dict[str, int]:
        """Job names that were created more than once (more than one UID)."""
        with self._lock:
            return {name: len(uids) for name, uids in self.uids.items() if len(uids) > 1}


@dataclass
class Report:
    """Counts and the violations behind them."""

    jobs: int = 0
    terminal: int = 0
    stuck: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)  # off the expected path for a cause found outside memfit
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.stuck or self.duplicates or self.orphans or self.inconsistent or self.unexpected)

    def summary(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "terminal": self.terminal,
            "phases": dict(sorted(self.phases.items())),
            "stuck": len(self.stuck),
            "duplicate_training_jobs": sum(n - 1 for n in self.duplicates.values()),
            "orphans": len(self.orphans),
            "status_inconsistent": len(self.inconsistent),
            "unexpected_outcome": len(self.unexpected),
            "explained_outcome": len(self.explained),
            "explanations": self.explained[:50],
            "violations": (
                self.stuck
                + [f"duplicate {k} x{v}" for k, v in self.duplicates.items()]
                + self.orphans
                + self.inconsistent
                + self.unexpected
            )[:50],
        }


def _raw_list(call: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    resp = Kube.raw(call, *args, **kwargs) or {}
    return list(resp.get("items") or [])


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def _job_state(job: dict[str, Any]) -> str:
    for kind in ("Complete", "Failed"):
        if _condition(job, kind).get("status") == "True":
            return kind
    return "Active"


def world(kube: Kube, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """MOTJs, Jobs, memfit ConfigMaps, Services, checkpoint claims and Pods of the namespace, as raw dicts."""
    custom = client.CustomObjectsApi(kube.api_client)
    return {
        "motjs": _raw_list(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, MOTJ),
        "jobs": _raw_list(kube.batch.list_namespaced_job, namespace),
        "configmaps": _raw_list(kube.core.list_namespaced_config_map, namespace, label_selector=MANAGED),
        "services": _raw_list(kube.core.list_namespaced_service, namespace, label_selector=MANAGED),
        "persistentvolumeclaims": _raw_list(
            kube.core.list_namespaced_persistent_volume_claim, namespace, label_selector=MANAGED
        ),
        "pods": _raw_list(kube.core.list_namespaced_pod, namespace, label_selector=MANAGED),
    }


def check_world(
    kube: Kube,
    namespace: str,
    *,
    recorder: JobRecorder | None = None,
    expected: dict[str, tuple[str, list[str]]] | None = None,
    explain: Callable[[str, dict[str, Any]], str | None] | None = None,
) -> Report:
    """Check every invariant on the namespace's current state.

    expected: job name -> (phase, attempt outcomes) for jobs whose lifecycle is known in advance.
    explain: (job name, status) -> why a job left its expected path for a cause outside memfit (the
    harness's own evidence), or None; an explained job is counted apart, not as unexpected.
    """
    w = world(kube, namespace)
    report = Report(duplicates=recorder.duplicates() if recorder else {})
    motjs = {m["metadata"]["name"]: m for m in w["motjs"] if not m["metadata"].get("deletionTimestamp")}
    owners = {m["metadata"]["uid"] for m in w["motjs"]}
    jobs = {j["metadata"]["name"]: j for j in w["jobs"]}
    cms = {c["metadata"]["name"] for c in w["configmaps"]}
    job_uids = {j["metadata"]["uid"] for j in w["jobs"]}
    report.jobs = len(motjs)
    for kind in ("jobs", "configmaps", "services", "persistentvolumeclaims", "pods"):
        for obj in w[kind]:
            meta = obj["metadata"]
            if (meta.get("labels") or {}).get("memfit.dev/component") == PROFILE_CACHE:
                continue  # owned by no job on purpose: it outlives them
            refs = {r["uid"] for r in meta.get("ownerReferences") or []}
            alive = owners | (job_uids if kind == "pods" else set())
            if not refs & alive:
                report.orphans.append(f"{kind[:-1]} {meta['name']} has no live owner")
    for name, motj in sorted(motjs.items()):
        status = motj.get("status") or {}
        phase = status.get("phase", "")
        report.phases[phase or "none"] = report.phases.get(phase or "none", 0) + 1
        if phase not in TERMINAL:
            report.stuck.append(f"{name}: phase {phase or 'none'} ({status.get('message', '')[:160]})")
            continue
        report.terminal += 1
        report.inconsistent += _consistency(name, status, jobs, cms)
        if expected and name in expected:
            want_phase, want_outcomes = expected[name]
            outcomes = [a.get("outcome") for a in status.get("attempts") or []]
            if phase != want_phase or outcomes != want_outcomes:
                seen = f"{name}: {phase} {outcomes}, expected {want_phase} {want_outcomes}"
                why = explain(name, status) if explain else None
                if why:
                    report.explained.append(f"{seen}: {why}")
                else:
                    report.unexpected.append(f"{seen}: {status.get('message', '')[:200]}{_off_path(status)}")
    return report


def _off_path(status: dict[str, Any]) -> str:
    """The reasons of the attempts that did not succeed: what a reader needs to tell a wrong re-plan
    from a right one."""
    reasons = [f"attempt {a.get('index')} {a.get('outcome')}: {str(a.get('reason') or '')[:240]}"
               for a in status.get("attempts") or [] if a.get("outcome") != "Succeeded"]
    return f" ({'; '.join(reasons)})" if reasons else ""


def _consistency(
    name: str, status: dict[str, Any], jobs: dict[str, dict[str, Any]], cms: set[str]
) -> list[str]:
    """Status says what the children show: attempts <-> training Jobs and plan ConfigMaps."""
    out: list[str] = []
    attempts = status.get("attempts") or []
    phase = status["phase"]
    if [a.get("index") for a in attempts] != list(range(len(attempts))):
        out.append(f"{name}: attempt indices {[a.get('index') for a in attempts]}")
    for a in attempts:
        k = int(a.get("index", -1))
        job = jobs.get(f"{name}-train-{k}")
        outcome = a.get("outcome")
        if f"{name}-plan-{k}" not in cms:
            out.append(f"{name}: attempt {k} has no plan ConfigMap")
        if outcome in REPLANNED and job is not None:
            out.append(f"{name}: attempt {k} ended {outcome} but its Job still exists")
        if outcome == "Succeeded" and (job is None or _job_state(job) != "Complete"):
            out.append(f"{name}: attempt {k} Succeeded but Job is {job and _job_state(job)}")
        if outcome in ("Launching", "Running"):
            out.append(f"{name}: {phase} with attempt {k} still {outcome}")
    beyond = [j for j in jobs if j.startswith(f"{name}-train-") and _index(j, name) >= len(attempts)]
    if beyond:
        out.append(f"{name}: training Jobs {beyond} not recorded in status.attempts")
    succeeded = _condition({"status": status}, "Succeeded").get("status") == "True"
    failed = _condition({"status": status}, "Failed").get("status") == "True"
    if phase == "Succeeded" and (
        not succeeded or failed or not attempts or attempts[-1]["outcome"] != "Succeeded"
    ):
        out.append(f"{name}: Succeeded but conditions/attempts disagree")
    if phase == "Failed" and (not failed or succeeded):
        out.append(f"{name}: Failed but the Failed condition is not True")
    plan = status.get("plan") or {}
    if attempts and plan and plan.get("nodePool") != attempts[-1].get("nodePool"):
        out.append(
            f"{name}: status.plan on {plan.get('nodePool')} but last attempt on {attempts[-1].get('nodePool')}"
        )
    return out


def _index(job_name: str, name: str) -> int:
    tail = job_name[len(f"{name}-train-") :]
    return int(tail) if tail.isdigit() else -1


def leftovers(kube: Kube, namespace: str) -> list[str]:
    """Children still present after every MOTJ was deleted (garbage collection must remove them)."""
    w = world(kube, namespace)
    out = [f"job {j['metadata']['name']}" for j in w["jobs"]]
    out += [
        f"configmap {c['metadata']['name']}"
        for c in w["configmaps"]
        if (c["metadata"].get("labels") or {}).get("memfit.dev/component") != PROFILE_CACHE
    ]
    out += [f"service {s['metadata']['name']}" for s in w["services"]]
    out += [f"pod {p['metadata']['name']}" for p in w["pods"]]
    return out

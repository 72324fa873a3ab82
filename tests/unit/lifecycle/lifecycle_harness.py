"""An in-memory stand-in for the API server's children of one MOTJ, and a reconcile loop over it.

`Harness.reconcile()` runs exactly what the controller runs (observe_snapshot -> decide -> apply ->
store status) with the children kept in a dict, so a lifecycle test walks a job through its phases
without a cluster and asserts the decided status, the children and the events. The test plays the
Job controller and the kubelet: it sets Job conditions and adds pods (`complete`, `add_pod`, ...).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from memfit.api.job import MemoryOptimizedTrainingJobSpec, MemoryOptimizedTrainingJobStatus
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.controller.read_snapshot import observe_snapshot
from memfit.controller.settings import OperatorSettings
from memfit.kube.profile_cache import CachedProfile, parse_profile_cache
from memfit.kube.train_job import PLAN_KEY
from memfit.lifecycle import Decision, Delete, Ensure, PoolCapacity, World, WriteData, decide
from memfit.memory.problems import shape_from_problem

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
POOLS = tuple(
    sorted(
        (
            GPUNodePool.model_validate(d)
            for d in yaml.safe_load_all((REPO / "hack/kwok/gpunodepools.yaml").read_text())
        ),
        key=lambda p: p.metadata.name,
    )
)
WORLD = World(POOLS, {})  # no capacity entry: every pool can grow to maxNodes
SETTINGS = OperatorSettings(trainer_image="memfit-trainer:test")
Manifest = dict[str, Any]


def busy_world() -> World:
    """Every GPU of every pool in use and no room to grow."""
    return World(
        POOLS, {p.metadata.name: PoolCapacity(p.spec.max_nodes, p.spec.max_nodes, 8, 0, 0) for p in POOLS}
    )


def quickstart(**spec: Any) -> Manifest:
    doc: Manifest = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())["spec"]
    doc.update(spec)
    return doc


def profile_message(spec: Manifest) -> str:
    problem = MemoryOptimizedTrainingJobSpec.model_validate(spec).problem
    return Profile(problem_hash="x", shape=shape_from_problem(problem), seconds=12.5).to_json()


def terminated(code: int, message: str = "", reason: str = "Error") -> Manifest:
    return {
        "containerStatuses": [
            {"name": "c", "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}}}
        ]
    }


# Every distinct spec gets its own generation, as the API server bumps it on each spec change: the operator
# parses a spec once per (uid, generation) (controller.parsed_bodies), and every harness job is "uid-1".
_GENERATIONS: dict[str, int] = {}


def generation_of(spec: Manifest) -> int:
    return _GENERATIONS.setdefault(json.dumps(spec, sort_keys=True, default=str), len(_GENERATIONS) + 1)


@dataclass
class Harness:
    """One MOTJ named `j` in namespace `ns`, its children, and the clock."""

    spec: Manifest = field(default_factory=quickstart)
    world: World = WORLD
    now: datetime = T0
    name: str = "j"
    annotations: dict[str, str] = field(default_factory=dict)
    status: Manifest = field(default_factory=dict)
    objects: dict[tuple[str, str], Manifest] = field(default_factory=dict)  # (kind, name) -> manifest
    pods: dict[str, Manifest] = field(default_factory=dict)
    metrics: dict[str, float] | None = None  # what rank 0's /metrics serves (None: unreachable)
    writes: list[str] = field(default_factory=list)  # "create Job/j-profile", "delete Job/...", ...

    # --- the reads observe_snapshot makes -----------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get(("Job", name)))

    def get_config_map(self, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get(("ConfigMap", name)))

    def profile_cache(self, namespace: str, name: str) -> CachedProfile | None:
        return parse_profile_cache((self.get_config_map(namespace, name) or {}).get("data"))

    def get_claim(self, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get(("PersistentVolumeClaim", name)))

    def trainer_metrics(self, host: str, port: int, *, job: str) -> dict[str, float] | None:
        return dict(self.metrics) if self.metrics is not None else None

    def list_job_pods(self, namespace: str, selector: str, job: Manifest) -> list[Manifest]:
        return self.list_pods(namespace, selector)

    def list_pods(self, namespace: str, selector: str) -> list[Manifest]:
        wanted = dict(term.split("=", 1) for term in selector.split(","))
        return [
            copy.deepcopy(p)
            for p in self.pods.values()
            if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]

    def list_workloads(self, namespace: str, selector: str) -> list[Manifest]:
        key, _, value = selector.partition("=")
        return [
            copy.deepcopy(w)
            for (kind, _name), w in self.objects.items()
            if kind == "Workload" and w["metadata"].get("labels", {}).get(key) == value
        ]

    def get_local_queue(self, namespace: str, name: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get(("LocalQueue", name)))

    def get_cluster_queue(self, name: str) -> Manifest | None:
        return copy.deepcopy(self.objects.get(("ClusterQueue", name)))

    def list_cluster_queues(self) -> list[Manifest]:
        return [copy.deepcopy(o) for (kind, _), o in self.objects.items() if kind == "ClusterQueue"]

    # --- one reconcile -------------------------------------------------------------------------------
    def body(self) -> Manifest:
        meta = {
            "name": self.name,
            "namespace": "ns",
            "uid": "uid-1",
            "generation": generation_of(self.spec),
            "annotations": self.annotations,
        }
        return {"metadata": meta, "spec": self.spec, "status": copy.deepcopy(self.status)}

    def reconcile(self) -> Decision:
        snap = observe_snapshot(self, self.body(), settings=SETTINGS, world=self.world, now=self.now)
        decision = decide(snap)
        self.apply(decision)
        if decision.status != snap.status or not self.status:
            self.status = decision.status.to_wire()
        return decision

    def apply(self, decision: Decision) -> None:
        for effect in decision.effects:
            if isinstance(effect, Ensure):
                key = (effect.manifest["kind"], effect.manifest["metadata"]["name"])
                if key in self.objects:
                    if effect.record:
                        assert self.objects[key]["data"][PLAN_KEY] == effect.manifest["data"][PLAN_KEY]
                    continue
                self.objects[key] = copy.deepcopy(effect.manifest)
                self.writes.append(f"create {key[0]}/{key[1]}")
            elif isinstance(effect, Delete):
                self.objects.pop(("Job", effect.name), None)
                for pod in [p for p in self.pods if p.startswith(f"{effect.name}-")]:
                    del self.pods[pod]
                self.writes.append(f"delete Job/{effect.name}")
            elif isinstance(effect, WriteData):
                key = ("ConfigMap", effect.manifest["metadata"]["name"])
                self.objects[key] = copy.deepcopy(effect.manifest)
                self.writes.append(f"write ConfigMap/{key[1]}")

    # --- the Job controller and the kubelet ----------------------------------------------------------
    def job(self, name: str) -> Manifest:
        return self.objects[("Job", name)]

    def start(self, job: str, *, at: datetime | None = None) -> None:
        """The Job controller's first sync."""
        self.job(job).setdefault("status", {})["startTime"] = _iso(at or self.now)

    def add_pod(self, job: str, index: int = 0, *, phase: str = "Running", node: str = "", **status: Any) -> str:
        template = self.job(job)["spec"]["template"]
        name = f"{job}-{index}"
        self.pods[name] = {
            "metadata": {"name": name, "labels": dict(template["metadata"]["labels"])},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, **status},
        }
        if phase == "Running":
            self.job(job).setdefault("status", {})["active"] = index + 1
        return name

    def unschedulable(
        self, job: str, *, since: datetime, index: int = 0,
        message: str = "0/3 nodes are available: Insufficient nvidia.com/gpu.", claims: tuple[str, ...] = (),
    ) -> None:
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": _iso(since),
            "message": message,
        }
        self.add_pod(job, index, phase="Pending", conditions=[cond])
        if claims:
            self.pods[f"{job}-{index}"]["spec"]["volumes"] = [
                {"name": f"v{i}", "persistentVolumeClaim": {"claimName": claim}} for i, claim in enumerate(claims)
            ]

    def finish(self, job: str, *, failed: bool = False, reason: str = "", message: str = "") -> None:
        cond = {
            "type": "Failed" if failed else "Complete",
            "status": "True",
            "reason": reason,
            "message": message,
        }
        self.job(job).setdefault("status", {})["conditions"] = [cond]

    def seed_profile(self) -> None:
        """An earlier job of the same problem left its profile in the shared cache."""
        from memfit.controller.read_snapshot import launch_settings
        from memfit.kube.profile_cache import CachedProfile, build_profile_cache
        from memfit.lifecycle.profiling import profile_key

        spec = MemoryOptimizedTrainingJobSpec.model_validate(self.spec)
        digest = profile_key(spec, MemoryOptimizedTrainingJobStatus(), launch_settings(SETTINGS), self.world)
        profile = Profile(problem_hash=digest[:16], shape=shape_from_problem(spec.problem))
        cache = build_profile_cache(namespace="ns", problem_hash=digest, cached=CachedProfile(profile, ()))
        self.objects[("ConfigMap", cache["metadata"]["name"])] = cache

    def later(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    # --- reading the outcome -------------------------------------------------------------------------
    @property
    def stored(self) -> MemoryOptimizedTrainingJobStatus:
        return MemoryOptimizedTrainingJobStatus.model_validate(self.status)

    def condition(self, type_: str) -> tuple[str, str, str]:
        cond = next(c for c in self.stored.conditions if c.type == type_)
        return cond.status.value, cond.reason, cond.message

    def children(self) -> set[str]:
        return {f"{kind}/{name}" for kind, name in self.objects}

    def plan_json(self, attempt: int) -> Manifest:
        return json.loads(self.objects[("ConfigMap", f"{self.name}-plan-{attempt}")]["data"][PLAN_KEY])


def _iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")

"""The reader reads what the job's stage needs (controller.snapshot + lifecycle.snapshot's rules)."""

from __future__ import annotations

import json

from lifecycle_harness import SETTINGS, Harness, quickstart, terminated
from memfit.controller.read_snapshot import observe_snapshot


def running(harness: type[Harness] = Harness) -> Harness:
    h = harness(spec=quickstart())
    h.seed_profile()
    h.reconcile()
    h.start("j-train-0")
    h.add_pod("j-train-0")
    h.reconcile()
    return h


def test_monitoring_reads_neither_pools_nor_profile() -> None:
    h = running()
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=None, now=h.now)  # no API server to ask
    assert snap.world is None and snap.profile_cache is None and snap.profiling is None
    assert snap.attempt is not None and snap.attempt.index == 0 and snap.attempt.plan_recorded
    assert snap.attempt.job is not None and [p.name for p in snap.attempt.job.pods] == ["j-train-0-0"]


def test_a_finished_attempt_reads_the_profile_cache_to_learn() -> None:
    h = running()
    oom = json.dumps({"reason": "CUDAOutOfMemory", "peakBytes": 1, "step": 1})
    h.pods["j-train-0-0"]["status"] = {"phase": "Failed", **terminated(87, oom)}
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=None, now=h.now)
    assert snap.world is None and snap.profile_cache is not None


def test_before_launch_reads_the_recorded_plan_of_the_next_attempt() -> None:
    h = running()
    body = h.body()
    body["status"] = {}
    snap = observe_snapshot(h, body, settings=SETTINGS, world=h.world, now=h.now)
    assert snap.recorded_plan is not None and snap.recorded_plan.plan.attempt == 0
    assert snap.recorded_plan.summary is not None and snap.recorded_plan.summary.savings is not None
    assert snap.attempt is None and snap.world is h.world


def test_invalid_or_terminal_jobs_read_nothing() -> None:
    h = Harness(spec=quickstart(strategy={"engine": "ddp", "zeroStage": 3}))
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=None, now=h.now)
    assert snap.spec is None or snap.spec_problems
    assert (snap.world, snap.profile_cache, snap.profiling, snap.attempt) == (None, None, None, None)


def test_a_used_cached_profile_skips_the_profiling_job() -> None:
    h = Harness(spec=quickstart())
    h.seed_profile()
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=h.world, now=h.now)
    assert snap.profile_cache is not None and snap.profiling is None
    h.objects[("Job", "j-profile")] = {"metadata": {"name": "j-profile"}, "status": {}}
    h.spec = quickstart(profiling={"reuse": False})
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=h.world, now=h.now)
    assert snap.profiling is not None and snap.profiling.name == "j-profile"


class CountingReads(Harness):
    """The harness, counting plan ConfigMap reads."""

    config_map_reads: int = 0

    def get_config_map(self, namespace: str, name: str) -> dict[str, object] | None:
        self.config_map_reads += 1
        return super().get_config_map(namespace, name)


def test_a_running_attempt_takes_its_plan_from_the_job_and_reads_the_config_map_only_for_a_pod_waiting_on_its_node() -> None:
    h = running(CountingReads)
    assert isinstance(h, CountingReads)
    h.config_map_reads = 0
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=None, now=h.now)
    assert h.config_map_reads == 0 and snap.attempt is not None and snap.attempt.plan is not None
    # Somebody deletes the plan ConfigMap: a replacement pod cannot mount it and waits; that pass reads
    # the ConfigMap, finds it gone, and the decision restores it.
    del h.objects[("ConfigMap", "j-plan-0")]
    h.add_pod("j-train-0", 1, phase="Pending")  # not placed yet: it waits for a node, not for a volume
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=None, now=h.now)
    assert h.config_map_reads == 0 and snap.attempt is not None and snap.attempt.plan_recorded
    h.add_pod("j-train-0", 1, phase="Pending", node="gpu-node-1")
    snap = observe_snapshot(h, h.body(), settings=SETTINGS, world=None, now=h.now)
    assert h.config_map_reads == 1 and snap.attempt is not None and not snap.attempt.plan_recorded
    h.reconcile()
    assert ("ConfigMap", "j-plan-0") in h.objects

"""A settled pod list is reused while its Job keeps its version (controller.settled_pods), and the list
and parse reuse of a pass never hides a change (controller.parsed_bodies)."""

from __future__ import annotations

from typing import Any

from memfit.controller.kubeapi import KubeApi
from memfit.controller.parsed_bodies import spec_of
from memfit.controller.settled_pods import SWEEP_EVERY, SettledPods, settled

SELECTOR = "memfit.dev/job=a,memfit.dev/attempt=0"


def job(rv: str, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "a-train-0", "uid": uid, "resourceVersion": rv}}


def pod(phase: str, ip: str = "10.0.0.7", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", **meta}, "status": {"phase": phase, **({"podIP": ip} if ip else {})}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingApi(KubeApi):
    """Only the pod list is served (no clients: nothing reaches a cluster); each list is counted."""

    def __init__(self, pods: list[dict[str, Any]], kept: SettledPods) -> None:
        self.pods, self.lists = pods, 0
        self.settled_pods = kept

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.lists += 1
        return list(self.pods)


def test_what_counts_as_settled() -> None:
    assert settled(pod("Running")) and settled(pod("Succeeded", ip="")) and settled(pod("Failed", ip=""))
    assert not settled(pod("Pending"))
    assert settled(pod("Running", ip=""))  # a simulated pod has no address
    assert not settled(pod("Running", deletionTimestamp="2026-12-06T00:00:00Z"))


def test_a_settled_list_is_reused_while_the_job_keeps_its_version_and_is_trusted() -> None:
    clock = Clock()
    api = CountingApi([pod("Running")], SettledPods(clock=clock, trust_seconds=20))
    assert api.list_job_pods("ns", SELECTOR, job("5")) == [pod("Running")]
    assert api.list_job_pods("ns", SELECTOR, job("5")) == [pod("Running")]
    assert api.lists == 1
    api.pods = [pod("Succeeded")]
    assert api.list_job_pods("ns", SELECTOR, job("6")) == [pod("Succeeded")]  # the Job changed: listed
    assert api.lists == 2
    clock.now = 21
    api.list_job_pods("ns", SELECTOR, job("6"))  # no longer trusted: listed
    assert api.lists == 3
    api.list_job_pods("ns", SELECTOR, job("6", uid="recreated"))
    assert api.lists == 4


def test_a_list_with_a_pending_pod_or_no_pod_is_never_reused() -> None:
    api = CountingApi([pod("Running"), pod("Pending", ip="")], SettledPods(clock=Clock()))
    api.list_job_pods("ns", SELECTOR, job("5"))
    api.list_job_pods("ns", SELECTOR, job("5"))
    assert api.lists == 2
    api.pods = []
    api.list_job_pods("ns", SELECTOR, job("5"))
    api.list_job_pods("ns", SELECTOR, job("5"))
    assert api.lists == 4


def test_without_a_cache_every_call_lists() -> None:
    api = CountingApi([pod("Running")], SettledPods())
    api.settled_pods = None
    api.list_job_pods("ns", SELECTOR, job("5"))
    api.list_job_pods("ns", SELECTOR, job("5"))
    assert api.lists == 2


def test_lists_no_pass_may_reuse_are_swept() -> None:
    clock = Clock()
    kept = SettledPods(clock=clock, trust_seconds=20)
    for i in range(SWEEP_EVERY - 1):
        kept.keep("ns", f"memfit.dev/job=j{i}", job("1"), [pod("Succeeded")])
    assert len(kept) == SWEEP_EVERY - 1
    clock.now = 30
    kept.keep("ns", "memfit.dev/job=last", job("1"), [pod("Running")])
    assert len(kept) == 1


def motj(generation: int, rv: str, micro: int) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "parsed",
            "uid": "p1",
            "generation": generation,
            "resourceVersion": rv,
        },
        "spec": {
            "problem": {
                "builtin": {
                    "kind": "gpt",
                    "layers": 2,
                    "hidden": 64,
                    "heads": 4,
                    "vocab": 512,
                    "sequenceLength": 64,
                }
            },
            "training": {"globalBatchSize": 8, "maxSteps": 5},
            "strategy": {"microBatchSize": micro},
        },
        "status": {"phase": "Pending", "message": f"rv {rv}"},
    }


def test_a_spec_is_parsed_again_when_its_generation_changes() -> None:
    first = motj(1, "10", micro=2)
    spec, problems = spec_of(first["metadata"], first["spec"])
    assert spec is not None and not problems
    assert spec_of(first["metadata"], first["spec"])[0] is spec  # same generation: the parsed value
    changed = motj(2, "11", micro=4)
    spec2, _ = spec_of(changed["metadata"], changed["spec"])
    assert spec2 is not None and spec2 is not spec and spec2.strategy.micro_batch_size == 4


def test_a_body_without_versions_is_parsed_each_time() -> None:
    body = motj(1, "10", micro=2)
    meta = {"name": "parsed"}
    assert spec_of(meta, body["spec"])[0] is not spec_of(meta, body["spec"])[0]

"""The real-node campaign tells a NoCapacity re-plan caused by neighbours holding every GPU from an
unexplained one (hack/memfit_testbed/reliability/gpu_occupancy)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from memfit_testbed.kwok_pools import POOL_LABEL
from memfit_testbed.reliability.gpu_occupancy import GpuOccupancy, free_gpus, waited_on_busy_gpus

T0 = datetime(2026, 12, 6, 10, 0, 0, tzinfo=UTC)
TIMEOUT = 60


def node(name: str, pool: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {POOL_LABEL: pool}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def pod(node_name: str | None, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {"spec": {"nodeName": node_name,
                     "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}, {"resources": {}}]},
            "status": {"phase": phase}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def status(finished: float, *, gpus: int = 1, nodes: int = 1) -> dict[str, Any]:
    stamp = at(finished).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"phase": "Succeeded", "attempts": [
        {"index": 0, "nodes": nodes, "gpus": gpus, "nodePool": "l4", "outcome": "NoCapacity",
         "startedAt": at(0).strftime("%Y-%m-%dT%H:%M:%SZ"), "finishedAt": stamp},
        {"index": 1, "nodes": 1, "nodePool": "l4", "outcome": "Succeeded"}]}


def occupancy(free_from: float | None) -> GpuOccupancy:
    """One 4-GPU node of pool l4, every GPU held by running pods (two pending ones ask for more) until
    `free_from`, then one finished."""
    o = GpuOccupancy(kube=None)  # type: ignore[arg-type]  # observe() needs no cluster
    for t in range(0, 100):
        done = free_from is not None and t >= free_from
        pods = [pod("rn", 2), pod("rn", 1), pod("rn", 1, "Succeeded" if done else "Running"), pod(None, 2),
                pod("rn", 3, "Failed")]
        o.observe([node("rn", "l4", 4), node("kwok-0", "t4", 8)], pods, at(t))
    return o


def test_free_gpus_count_what_bound_unfinished_pods_ask_for() -> None:
    assert free_gpus([node("rn", "l4", 4)], [pod("rn", 2), pod("rn", 1), pod(None, 4), pod("rn", 1, "Failed")]) \
        == {"l4": 1}
    assert free_gpus([node("a", "l4", 4), node("b", "l4", 4)], [pod("a", 4), pod("b", 1)]) == {"l4": 3}


def test_a_re_plan_while_every_gpu_was_held_is_explained() -> None:
    why = waited_on_busy_gpus(occupancy(free_from=None), TIMEOUT, status(finished=80))
    assert why is not None and "l4" in why and "60s" in why


def test_a_re_plan_while_a_gpu_was_free_stays_unexpected() -> None:
    assert waited_on_busy_gpus(occupancy(free_from=50), TIMEOUT, status(finished=80)) is None


def test_a_pod_asking_for_more_than_was_free_is_explained() -> None:
    o = occupancy(free_from=50)  # one GPU free from 50 s, but the attempt's pods ask for two each
    assert waited_on_busy_gpus(o, TIMEOUT, status(finished=80, gpus=4, nodes=2)) is not None


def test_no_polls_over_the_window_explain_nothing() -> None:
    assert waited_on_busy_gpus(occupancy(free_from=None), TIMEOUT, status(finished=300)) is None


def test_only_a_success_after_capacity_re_plans_is_explained() -> None:
    failed = status(finished=80) | {"phase": "Failed"}
    assert waited_on_busy_gpus(occupancy(free_from=None), TIMEOUT, failed) is None

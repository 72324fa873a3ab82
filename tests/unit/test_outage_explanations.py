"""The API-server outage harness tells a NoCapacity re-plan caused by nodes the node controller marked
not Ready from an unexplained one (hack/memfit_testbed/reliability: node_readiness, outage)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from memfit_testbed.kwok_pools import POOL_LABEL
from memfit_testbed.reliability.node_readiness import NodeReadiness
from memfit_testbed.reliability.outage import waited_on_unready_nodes

T0 = datetime(2026, 12, 4, 20, 14, 0, tzinfo=UTC)


def node(name: str, pool: str, ready: bool) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {POOL_LABEL: pool}},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def attempt(pool: str, outcome: str, start: float, end: float) -> dict[str, Any]:
    return {"index": 0, "nodes": 1, "nodePool": pool, "outcome": outcome, "startedAt": stamp(start),
            "finishedAt": stamp(end)}


def readiness() -> NodeReadiness:
    """t4-spot-1 not Ready from 60 s to 90 s; l4 Ready throughout."""
    r = NodeReadiness(kube=None)  # type: ignore[arg-type]  # observe() needs no cluster
    for t, ready in ((0, True), (60, False), (75, False), (90, True)):
        r.observe([node("t4-spot-0", "t4-spot", True), node("t4-spot-1", "t4-spot", ready),
                   node("l4-0", "l4", True)], at(t))
    return r


def test_windows_open_on_the_first_unready_poll_and_close_when_all_are_ready() -> None:
    r = readiness()
    assert r.windows["t4-spot"] == [(at(60), at(90))]
    assert r.windows["l4"] == []
    assert r.disrupted("t4-spot", at(30), at(70)) and r.disrupted("t4-spot", at(85), at(200))
    assert not r.disrupted("t4-spot", at(0), at(59)) and not r.disrupted("t4-spot", at(91), at(200))
    assert not r.disrupted("l4", at(0), at(200))
    assert r.summary() == {"t4-spot": [["20:15:00", "20:15:30"]]}


def test_a_window_still_open_covers_everything_after_it() -> None:
    r = NodeReadiness(kube=None)  # type: ignore[arg-type]
    cordoned = node("t4-spot-0", "t4-spot", True) | {"spec": {"unschedulable": True}}  # memfit counts no capacity
    r.observe([cordoned], at(10))
    assert r.disrupted("t4-spot", at(500), at(600))
    assert r.summary() == {"t4-spot": [["20:14:10", ""]]}


def test_a_capacity_replan_is_explained_only_when_its_pool_was_not_ready_while_it_waited() -> None:
    r = readiness()
    explained = {"phase": "Succeeded", "attempts": [attempt("t4-spot", "NoCapacity", 20, 80),
                                                    attempt("l4", "Succeeded", 80, 120)]}
    assert "t4-spot" in (waited_on_unready_nodes(r, explained) or "")
    before = {"phase": "Succeeded", "attempts": [attempt("t4-spot", "NoCapacity", 0, 50),
                                                 attempt("l4", "Succeeded", 50, 100)]}
    other_pool = {"phase": "Succeeded", "attempts": [attempt("l4", "NoCapacity", 20, 80),
                                                     attempt("t4-spot", "Succeeded", 80, 120)]}
    failed = {"phase": "Failed", "attempts": [attempt("t4-spot", "NoCapacity", 20, 80),
                                              attempt("l4", "Failed", 80, 120)]}
    oom = {"phase": "Succeeded", "attempts": [attempt("t4-spot", "OutOfMemory", 20, 80),
                                              attempt("l4", "Succeeded", 80, 120)]}
    for status in (before, other_pool, failed, oom, {"phase": "Succeeded", "attempts": []}):
        assert waited_on_unready_nodes(r, status) is None, status

"""How many GPUs each pool's nodes had free, seen by polling the Nodes and the pods bound to them.

The real-node campaign runs more lifecycles than its node has GPUs, so a job's pods may wait for GPUs its
neighbours hold. When the neighbours start slowly (the first containers of a freshly imported trainer
image wait for containerd to unpack it), that wait can outlast the quickstart's `capacityTimeoutSeconds`,
and memfit re-plans the job with outcome NoCapacity, as documented. `GpuOccupancy` is the harness's own
evidence of that: for every poll of the waiting window, no node of the pool had room for one of the
attempt's pods. An attempt re-planned while a node had room stays unexpected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memfit.api.job import Attempt, AttemptOutcome
from memfit.kube.common import GPU_RESOURCE as GPU
from memfit.lifecycle.capacity import gpus_requested_by_node

from memfit_testbed.kwok_pools import POOL_LABEL
from memfit_testbed.reliability.poller import Obj, Poller


def free_gpus(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, int]:
    """pool -> the most GPUs free on one of its nodes: allocatable less what bound, unfinished pods hold
    (memfit's own count of them, lifecycle.capacity)."""
    used = gpus_requested_by_node(pods)
    free: dict[str, int] = {}
    for node in nodes:
        pool = (node["metadata"].get("labels") or {}).get(POOL_LABEL)
        allocatable = int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0) or 0)
        if pool:
            free[pool] = max(free.get(pool, 0), allocatable - used.get(node["metadata"]["name"], 0))
    return free


@dataclass
class GpuOccupancy(Poller):
    """Polls every `interval` seconds; keeps (time, pool -> most GPUs free on one node)."""

    samples: list[tuple[datetime, dict[str, int]]] = field(default_factory=list)

    def poll(self) -> tuple[list[Obj], list[Obj]]:
        return self._list(self.kube.core.list_node), self._list(self.kube.core.list_pod_for_all_namespaces)

    def observe(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], now: datetime) -> None:
        with self._lock:
            self.samples.append((now, free_gpus(nodes, pods)))

    def full(self, pool: str, per_node: int, start: datetime, end: datetime) -> bool:
        """Whether every poll between `start` and `end` (at least one per 5 s) saw no node of `pool`
        with `per_node` GPUs free."""
        with self._lock:
            seen = [free.get(pool, 0) for at, free in self.samples if start <= at <= end]
        return len(seen) >= (end - start).total_seconds() / 5 and all(f < per_node for f in seen)


def waited_on_busy_gpus(occupancy: GpuOccupancy, timeout_seconds: int, status: dict[str, Any]) -> str | None:
    """Why a job that succeeded after NoCapacity re-plans did so, when each such attempt's pool had no
    room for one of its pods throughout the `timeout_seconds` before it gave up; None otherwise."""
    attempts = [Attempt.model_validate(a) for a in status.get("attempts") or []]
    capacity = [a for a in attempts if a.outcome == AttemptOutcome.NO_CAPACITY]
    if status.get("phase") != "Succeeded" or not capacity or len(capacity) != len(attempts) - 1:
        return None
    for a in capacity:
        per_node = max(1, (a.gpus or a.nodes) // a.nodes)
        if a.finished_at is None:
            return None
        start = a.finished_at - timedelta(seconds=timeout_seconds)
        if not occupancy.full(a.node_pool, per_node, start + timedelta(seconds=2), a.finished_at - timedelta(seconds=2)):
            return None
    pools = sorted({a.node_pool for a in capacity})
    return (f"no node of pool {', '.join(pools)} had a GPU free for the pod for capacityTimeoutSeconds "
            f"({timeout_seconds}s): the campaign's other jobs held them")

"""A Kueue ClusterQueue's GPU quota per pool, as a value the planner can respect.

Flavors are matched to pools by name (`memfit kueue flavors` names each flavor after its pool,
docs/kueue.md). Free quota = nominal quota - reserved (status.flavorsReservation: admitted and
quota-reserving Workloads); borrowing from a cohort is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """GPU quota of the ClusterQueue behind a job's LocalQueue, per flavor (= pool) name."""

    cluster_queue: str
    nominal_gpus: Mapping[str, int] = field(default_factory=dict)
    reserved_gpus: Mapping[str, int] = field(default_factory=dict)

    def nominal(self, pool: str) -> int:
        """All the GPUs the queue may ever hold on `pool` (0 when it has no flavor for it)."""
        return self.nominal_gpus.get(pool, 0)

    def free(self, pool: str) -> int:
        """GPUs of `pool` the queue can admit now."""
        return max(0, self.nominal(pool) - self.reserved_gpus.get(pool, 0))

    def describe(self) -> str:
        quotas = ", ".join(f"{p} {self.free(p)}/{n}" for p, n in sorted(self.nominal_gpus.items()))
        return f"ClusterQueue {self.cluster_queue} GPU quota free/nominal: {quotas or 'none'}"


def _gpus(value: Any) -> int | None:
    """A GPU quantity (a whole number, "4" or 4); None for anything else (a GPU is not divisible)."""
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def parse_cluster_queue(cq: Mapping[str, Any]) -> QueueQuota:
    """The GPU quota of a ClusterQueue manifest (v1beta2): nominal per flavor, reserved per flavor."""
    nominal: dict[str, int] = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                gpus = _gpus(res.get("nominalQuota"))
                if res.get("name") == GPU_RESOURCE and gpus is not None:
                    nominal[str(flavor.get("name"))] = gpus
    reserved: dict[str, int] = {}
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            gpus = _gpus(res.get("total"))
            if res.get("name") == GPU_RESOURCE and gpus is not None:
                reserved[str(flavor.get("name"))] = gpus
    return QueueQuota(str((cq.get("metadata") or {}).get("name", "")), nominal, reserved)

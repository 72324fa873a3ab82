"""A Kueue ClusterQueue's GPU quota per pool, as a value the planner can respect.

Flavors are matched to pools by name (`memfit kueue flavors` names each flavor after its pool,
docs/kueue.md), and each flavor's quota is read for its pool's own resource: `nvidia.com/gpu`, or a
MIG pool's `nvidia.com/mig-<profile>` (a DRA pool's DeviceClass is mapped to the same names in Kueue's
`deviceClassMappings`, docs/dra.md), so the "GPUs" below are slices on a MIG pool. Free quota = nominal quota - reserved (status.flavorsReservation: admitted and
quota-reserving Workloads), plus what the queue may borrow from its cohort now.

Borrowing follows Kueue's rule for a flat cohort (`spec.cohortName`): a queue may use up to its nominal
quota plus its `borrowingLimit` (no limit when unset; nothing without a cohort), as long as the cohort as
a whole has unused quota; each other member lends its nominal quota, or only its `lendingLimit` of it.
Hierarchical cohorts (the Cohort API's parents and their own quotas) are not modelled: only the
ClusterQueues that name the cohort count, which can only under-count what Kueue would lend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
UNLIMITED = 1 << 30


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """GPU quota of the ClusterQueue behind a job's LocalQueue, per flavor (= pool) name."""

    cluster_queue: str
    nominal_gpus: Mapping[str, int] = field(default_factory=dict)
    reserved_gpus: Mapping[str, int] = field(default_factory=dict)
    # Borrowing from the cohort, per flavor: the most the queue may borrow ever (min of its borrowing
    # limit and what the others lend), and the cohort's unused quota now.
    borrowable_gpus: Mapping[str, int] = field(default_factory=dict)
    cohort_unused_gpus: Mapping[str, int] = field(default_factory=dict)
    cohort: str = ""

    def nominal(self, pool: str) -> int:
        """All the GPUs the queue may ever hold on `pool` (0 when it has no flavor for it): its nominal
        quota plus what it may borrow."""
        return self.nominal_gpus.get(pool, 0) + self.borrowable_gpus.get(pool, 0)

    def free(self, pool: str) -> int:
        """GPUs of `pool` the queue can admit now: up to its ceiling, within the cohort's unused quota."""
        own_room = self.nominal(pool) - self.reserved_gpus.get(pool, 0)
        if not self.cohort:
            return max(0, own_room)
        return max(0, min(own_room, self.cohort_unused_gpus.get(pool, 0)))

    def describe(self) -> str:
        def one(pool: str, nominal: int) -> str:
            borrow = self.borrowable_gpus.get(pool, 0)
            return f"{pool} {self.free(pool)}/{nominal}" + (f" (+{borrow} borrowable)" if borrow else "")

        quotas = ", ".join(one(p, n) for p, n in sorted(self.nominal_gpus.items()))
        cohort = f" (cohort {self.cohort})" if self.cohort else ""
        return f"ClusterQueue {self.cluster_queue}{cohort} GPU quota free/nominal: {quotas or 'none'}"


def _gpus(value: Any) -> int | None:
    """A GPU quantity (a whole number, "4" or 4); None for anything else (a GPU is not divisible)."""
    text = str(value).strip()
    return int(text) if text.isdigit() else None


@dataclass(frozen=True, slots=True)
class _Gpus:
    nominal: dict[str, int]
    reserved: dict[str, int]
    borrowing_limit: dict[str, int]
    lending_limit: dict[str, int]


def _read(cq: Mapping[str, Any], resources: Mapping[str, str]) -> _Gpus:
    """The quota of each flavor in its pool's resource (`resources`: flavor -> resource; nvidia.com/gpu
    for a flavor not named there)."""
    nominal: dict[str, int] = {}
    borrowing: dict[str, int] = {}
    lending: dict[str, int] = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                gpus = _gpus(res.get("nominalQuota"))
                name = str(flavor.get("name"))
                if res.get("name") != resources.get(name, GPU_RESOURCE) or gpus is None:
                    continue
                nominal[name] = gpus
                if (limit := _gpus(res.get("borrowingLimit"))) is not None:
                    borrowing[name] = limit
                if (limit := _gpus(res.get("lendingLimit"))) is not None:
                    lending[name] = limit
    reserved: dict[str, int] = {}
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            gpus = _gpus(res.get("total"))
            name = str(flavor.get("name"))
            if res.get("name") == resources.get(name, GPU_RESOURCE) and gpus is not None:
                reserved[name] = gpus
    return _Gpus(nominal, reserved, borrowing, lending)


def cohort_of(cq: Mapping[str, Any]) -> str:
    return str((cq.get("spec") or {}).get("cohortName") or "")


def parse_cluster_queue(cq: Mapping[str, Any], cohort: Sequence[Mapping[str, Any]] = (),
                        resources: Mapping[str, str] | None = None) -> QueueQuota:
    """The GPU quota of a ClusterQueue manifest (v1beta2): nominal and reserved per flavor, and, when
    it names a cohort, what it may borrow from `cohort` (every ClusterQueue, itself included or not;
    those of other cohorts are ignored). `resources` names the resource each flavor's pool requests
    (flavor name -> `nvidia.com/mig-1g.10gb`...); a flavor not named there counts `nvidia.com/gpu`."""
    name = str((cq.get("metadata") or {}).get("name", ""))
    resources = resources or {}
    own = _read(cq, resources)
    cohort_name = cohort_of(cq)
    if not cohort_name:
        return QueueQuota(name, own.nominal, own.reserved)
    peers = [_read(p, resources) for p in cohort
             if cohort_of(p) == cohort_name and str((p.get("metadata") or {}).get("name", "")) != name]
    borrowable: dict[str, int] = {}
    unused: dict[str, int] = {}
    for flavor, nominal in own.nominal.items():
        lent = sum(p.lending_limit.get(flavor, p.nominal.get(flavor, 0)) for p in peers)
        borrowable[flavor] = min(own.borrowing_limit.get(flavor, UNLIMITED), lent)
        capacity = nominal + lent
        used = own.reserved.get(flavor, 0) + sum(
            # what a peer uses beyond the part it keeps for itself comes out of the lent quota
            max(0, p.reserved.get(flavor, 0) - (p.nominal.get(flavor, 0) - p.lending_limit.get(flavor, p.nominal.get(flavor, 0))))
            for p in peers)
        unused[flavor] = max(0, capacity - used)
    return QueueQuota(name, own.nominal, own.reserved, borrowable, unused, cohort_name)

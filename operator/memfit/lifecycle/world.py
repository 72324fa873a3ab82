"""What a plan needs from the cluster, as values: the GPUNodePools and their live capacity."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG, GpuCatalog
from memfit.lifecycle.quota import QueueQuota


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """Live capacity of one pool."""

    nodes: int
    ready_nodes: int
    allocatable_gpus: int
    free_gpus: int
    free_whole_nodes: int  # ready nodes with every GPU free: what a multi-GPU pod per node needs
    # Free GPUs of each ready node with some GPUs in use and some free, most first: where a plan that
    # needs part of a node (1, 2, 4 GPUs) can go without a new node.
    free_gpus_on_shared_nodes: tuple[int, ...] = ()

    def to_status(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "readyNodes": self.ready_nodes,
            "allocatableGpus": self.allocatable_gpus,
            "freeGpus": self.free_gpus,
        }


@dataclass(frozen=True, slots=True)
class World:
    """Cluster-wide inputs of a reconcile: pools (sorted by name), their live capacity, and the GPU
    catalog the planner fills a pool's unstated GPU facts from (the built-in one unless given)."""

    pools: tuple[GPUNodePool, ...] = ()
    capacity: Mapping[str, PoolCapacity] = field(default_factory=dict)
    catalog: GpuCatalog = CATALOG
    # The job's Kueue ClusterQueue quota (scheduling.kueueQueue); per job, so set with `replace` on the
    # shared world by the reader. None: no queue, or its ClusterQueue could not be read.
    queue_quota: QueueQuota | None = None
    # The cluster's DeviceClass names, read when a pool requests its GPUs by DRA (None: not read).
    device_classes: frozenset[str] | None = None

    def unusable_pools(self) -> dict[str, str]:
        """Pools no plan may use, and why, naming the field: a DRA pool whose DeviceClass does not exist."""
        if self.device_classes is None:
            return {}
        return {p.metadata.name: f"{p.metadata.name}: gpu.dra.deviceClassName {p.spec.gpu.dra.device_class_name!r} "
                f"is not a DeviceClass of the cluster (resource.k8s.io/v1)"
                for p in self.pools if p.spec.gpu.dra is not None
                and p.spec.gpu.dra.device_class_name not in self.device_classes}

    def pool(self, name: str) -> GPUNodePool | None:
        return next((p for p in self.pools if p.metadata.name == name), None)

    def names(self) -> str:
        return ", ".join(p.metadata.name for p in self.pools) or "none"

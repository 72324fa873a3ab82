"""Live GPUNodePool capacity from the cluster's Nodes and Pods (as values): nodes, ready nodes,
allocatable, free GPUs, whole free nodes and the free GPUs of partly used (shared) nodes; what plans
are made against and pool status shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG, GpuCatalog
from memfit.kube.common import GPU_RESOURCE
from memfit.lifecycle.world import PoolCapacity
from memfit.mig import devices_per_node, resource_name

Manifest = dict[str, Any]
TERMINAL_PHASES = ("Succeeded", "Failed")


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_matches(node: Manifest, selector: dict[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def node_ready(node: Manifest) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gpus_requested_by_node(pods: list[Manifest], resource: str = GPU_RESOURCE) -> dict[str, int]:
    """GPUs (or the MIG slices of `resource`) held by non-terminated pods, per node name."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            limits = resources.get("limits") or {}
            requests = resources.get("requests") or {}
            used[node] = used.get(node, 0) + _quantity(limits.get(resource, requests.get(resource, 0)))
    return used


def observe_pool_capacity(
    *, selector: dict[str, str], gpus_per_node: int, nodes: list[Manifest], used_by_node: dict[str, int],
    resource: str = GPU_RESOURCE,
) -> PoolCapacity:
    """Capacity of the pool whose node selector is `selector`, counted in `resource` (whole GPUs, or the
    slices of a MIG profile; `gpus_per_node` then counts slices)."""
    members = [n for n in nodes if node_matches(n, selector)]
    ready = [n for n in members if node_ready(n)]
    allocatable = 0
    free = 0
    whole = 0
    shared: list[int] = []
    for node in ready:
        alloc = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))
        node_free = max(0, alloc - used_by_node.get(node["metadata"]["name"], 0))
        allocatable += alloc
        free += node_free
        if node_free >= max(1, gpus_per_node):
            whole += 1
        elif node_free > 0:
            shared.append(node_free)
    return PoolCapacity(len(members), len(ready), allocatable, free, whole, tuple(sorted(shared, reverse=True)))


def observe_pools(pools: Sequence[GPUNodePool], *, nodes: list[Manifest], pods: list[Manifest],
                  catalog: GpuCatalog = CATALOG) -> dict[str, PoolCapacity]:
    """Every pool's capacity, each counted in the resource its pods request (memfit.mig.resource_name)."""
    used = {r: gpus_requested_by_node(pods, r) for r in {resource_name(p.spec.gpu) for p in pools}}
    out: dict[str, PoolCapacity] = {}
    for pool in pools:
        resource = resource_name(pool.spec.gpu)
        out[pool.metadata.name] = observe_pool_capacity(
            selector=pool.spec.node_selector, nodes=nodes, used_by_node=used[resource], resource=resource,
            gpus_per_node=devices_per_node(pool.spec.gpu, catalog.find(pool.spec.gpu.product)))
    return out

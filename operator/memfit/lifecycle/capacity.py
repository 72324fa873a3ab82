"""Live GPUNodePool capacity from the cluster's Nodes and Pods (as values): nodes, ready nodes,
allocatable, free GPUs, whole free nodes and the free GPUs of partly used (shared) nodes; what plans
are made against and pool status shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG, GpuCatalog
from memfit.kube.common import GPU_RESOURCE
from memfit.lifecycle.dra_capacity import DraInventory, allocated, devices_by_node
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
    resource: str = GPU_RESOURCE, allocatable_by_node: dict[str, int] | None = None,
) -> PoolCapacity:
    """Capacity of the pool whose node selector is `selector`, counted in `resource` (whole GPUs, or the
    slices of a MIG profile; `gpus_per_node` then counts slices), or in the devices `allocatable_by_node`
    gives (a DRA pool's, lifecycle.dra_capacity)."""
    members = [n for n in nodes if node_matches(n, selector)]
    ready = [n for n in members if node_ready(n)]
    allocatable = 0
    free = 0
    whole = 0
    shared: list[int] = []
    for node in ready:
        name = node["metadata"]["name"]
        if allocatable_by_node is not None:
            alloc = allocatable_by_node.get(name, 0)
        else:
            alloc = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0))
        node_free = max(0, alloc - used_by_node.get(name, 0))
        allocatable += alloc
        free += node_free
        if node_free >= max(1, gpus_per_node):
            whole += 1
        elif node_free > 0:
            shared.append(node_free)
    return PoolCapacity(len(members), len(ready), allocatable, free, whole, tuple(sorted(shared, reverse=True)))


def _dra_pool_capacity(pool: GPUNodePool, nodes: list[Manifest], inventory: DraInventory,
                       gpus_per_node: int) -> PoolCapacity:
    dra = pool.spec.gpu.dra
    assert dra is not None
    profile = pool.spec.gpu.mig.profile if pool.spec.gpu.mig is not None else None
    devices = devices_by_node(inventory, driver=dra.driver, mig_profile=profile)
    held = allocated(inventory, driver=dra.driver)
    return observe_pool_capacity(
        selector=pool.spec.node_selector, gpus_per_node=gpus_per_node, nodes=nodes,
        allocatable_by_node={node: len(found) for node, found in devices.items()},
        used_by_node={node: len(found & held) for node, found in devices.items()})


def observe_pools(pools: Sequence[GPUNodePool], *, nodes: list[Manifest], pods: list[Manifest],
                  catalog: GpuCatalog = CATALOG, dra: DraInventory | None = None) -> dict[str, PoolCapacity]:
    """Every pool's capacity, each counted in the resource its pods request (memfit.mig.resource_name), or a
    DRA pool's in the devices of its driver (`dra`; a DRA pool is left out when it is not given)."""
    plugin = [p for p in pools if p.spec.gpu.dra is None]
    used = {r: gpus_requested_by_node(pods, r) for r in {resource_name(p.spec.gpu) for p in plugin}}
    out: dict[str, PoolCapacity] = {}
    for pool in pools:
        per_node = devices_per_node(pool.spec.gpu, catalog.find(pool.spec.gpu.product))
        if pool.spec.gpu.dra is not None:
            if dra is not None:
                out[pool.metadata.name] = _dra_pool_capacity(pool, nodes, dra, per_node)
            continue
        resource = resource_name(pool.spec.gpu)
        out[pool.metadata.name] = observe_pool_capacity(
            selector=pool.spec.node_selector, nodes=nodes, used_by_node=used[resource], resource=resource,
            gpus_per_node=per_node)
    return out

"""Write GPUNodePool status (nodes, ready nodes, allocatable and free GPUs) when it changed."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from memfit.api.pool import GPUNodePool
from memfit.controller.kubeapi import KubeApi
from memfit.controller.world_cache import read_dra
from memfit.lifecycle.capacity import observe_pools


def reconcile_pools(api: KubeApi, *, nodes: list[dict[str, Any]] | None = None) -> int:
    """Update every pool's status from Nodes (read now unless given) and Pods; returns how many were
    patched. A MIG pool counts its profile's slices (memfit.mig)."""
    raw = api.list_pools()
    if not raw:
        return 0
    pools: list[GPUNodePool] = []
    for item in raw:
        try:
            pools.append(GPUNodePool.model_validate(item | {"status": None}))
        except ValidationError:
            continue  # the world observation logs it
    nodes = api.list_nodes() if nodes is None else nodes
    capacity = observe_pools(pools, nodes=nodes, pods=api.list_active_pods(), dra=read_dra(api, pools))
    current = {item["metadata"]["name"]: item.get("status") or {} for item in raw}
    patched = 0
    for pool in pools:
        name = pool.metadata.name
        if name not in capacity:
            continue  # a DRA pool whose devices could not be read
        wanted = capacity[name].to_status()
        if any(current[name].get(k) != v for k, v in wanted.items()):
            api.patch_pool_status(name, wanted)
            patched += 1
    return patched

"""Write GPUNodePool status (nodes, ready nodes, allocatable and free GPUs) when it changed."""

from __future__ import annotations

from typing import Any

from memfit.controller.kubeapi import KubeApi
from memfit.lifecycle.capacity import gpus_requested_by_node, observe_pool_capacity


def reconcile_pools(api: KubeApi, *, nodes: list[dict[str, Any]] | None = None) -> int:
    """Update every pool's status from Nodes (read now unless given) and Pods; returns how many were
    patched."""
    pools = api.list_pools()
    if not pools:
        return 0
    nodes = api.list_nodes() if nodes is None else nodes
    used = gpus_requested_by_node(api.list_active_pods())
    patched = 0
    for pool in pools:
        spec = pool.get("spec") or {}
        capacity = observe_pool_capacity(
            selector=dict(spec.get("nodeSelector") or {}),
            gpus_per_node=int((spec.get("gpu") or {}).get("perNode", 1)),
            nodes=nodes,
            used_by_node=used,
        )
        current = pool.get("status") or {}
        wanted = capacity.to_status()
        if any(current.get(k) != v for k, v in wanted.items()):
            api.patch_pool_status(pool["metadata"]["name"], wanted)
            patched += 1
    return patched

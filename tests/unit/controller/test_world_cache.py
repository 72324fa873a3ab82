"""The world cache: one observation per moment, Nodes kept longer, and forgotten at once when a rank's node
was drained or lost (its re-plan must not count that node)."""

from __future__ import annotations

from typing import Any

from memfit.controller.world_cache import WorldCache, observe_world
from memfit.lifecycle.dra_capacity import DraInventory


class CountingApi:
    """What observe_world reads, counted (the reads, not the API server, are under test here)."""

    def __init__(self) -> None:
        self.node_lists = 0
        self.nodes: list[dict[str, Any]] = [{"metadata": {"name": "n0", "labels": {}}}]

    def list_pools(self) -> list[dict[str, Any]]:
        return []

    def list_nodes(self) -> list[dict[str, Any]]:
        self.node_lists += 1
        return list(self.nodes)

    def list_active_pods(self) -> list[dict[str, Any]]:
        return []


def test_nodes_are_reread_after_their_ttl_or_when_a_node_was_lost() -> None:
    now = [0.0]
    cache = WorldCache(ttl_seconds=1.0, node_ttl_seconds=10.0, clock=lambda: now[0])
    api = CountingApi()
    cache.get(api)  # type: ignore[arg-type]
    now[0] = 2.0
    cache.get(api)  # type: ignore[arg-type]  # a new observation, the same Node list
    assert (cache.observations, api.node_lists) == (2, 1)
    cache.invalidate()
    cache.get(api)  # type: ignore[arg-type]
    assert (cache.observations, api.node_lists) == (3, 1)
    cache.invalidate(nodes=True)  # a rank's node was drained: the next plan lists the Nodes again
    cache.get(api)  # type: ignore[arg-type]
    assert (cache.observations, api.node_lists) == (4, 2)


class DraApi(CountingApi):
    """A cluster with one DRA pool, or none; counts the resource.k8s.io reads."""

    def __init__(self, pools: list[dict[str, Any]]) -> None:
        super().__init__()
        self.pools, self.dra_reads = pools, 0

    def list_pools(self) -> list[dict[str, Any]]:
        return list(self.pools)

    def list_dra(self) -> DraInventory:
        self.dra_reads += 1
        return DraInventory(device_classes=frozenset({"gpu.nvidia.com"}))


def test_dra_objects_are_read_only_when_a_pool_requests_gpus_by_claim() -> None:
    plain = {"metadata": {"name": "l4"}, "spec": {"gpu": {"product": "NVIDIA-L4"}}}
    api = DraApi([plain])
    world = observe_world(api)  # type: ignore[arg-type]
    assert (api.dra_reads, world.device_classes) == (0, None)
    by_claim = {"metadata": {"name": "h100"},
                "spec": {"gpu": {"product": "NVIDIA-H100-80GB-HBM3", "dra": {"deviceClassName": "gpu.nvidia.com"}}}}
    api = DraApi([plain, by_claim])
    world = observe_world(api)  # type: ignore[arg-type]
    assert (api.dra_reads, world.device_classes) == (1, frozenset({"gpu.nvidia.com"}))

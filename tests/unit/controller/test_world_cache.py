"""The world cache: one observation per moment, Nodes kept longer, and forgotten at once when a rank's node
was drained or lost (its re-plan must not count that node)."""

from __future__ import annotations

from typing import Any

from memfit.controller.world_cache import WorldCache


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

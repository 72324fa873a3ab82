"""Pool capacity from Nodes and Pods."""

from __future__ import annotations

from typing import Any

from memfit.lifecycle.capacity import gpus_requested_by_node, observe_pool_capacity


def node(name: str, gpus: int, *, ready: bool = True, pool: str = "l4") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"memfit.dev/pool": pool}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def gpu_pod(node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def test_free_gpus_and_whole_nodes() -> None:
    nodes = [node("a", 4), node("b", 4), node("c", 4, ready=False), node("x", 8, pool="a100")]
    used = gpus_requested_by_node([gpu_pod("a", 3), gpu_pod("b", 4, "Succeeded"), gpu_pod("x", 8)])
    cap = observe_pool_capacity(
        selector={"memfit.dev/pool": "l4"}, gpus_per_node=4, nodes=nodes, used_by_node=used
    )
    assert (cap.nodes, cap.ready_nodes, cap.allocatable_gpus, cap.free_gpus, cap.free_whole_nodes) == (
        3,
        2,
        8,
        5,
        1,
    )


def test_empty_selector_matches_nothing() -> None:
    cap = observe_pool_capacity(selector={}, gpus_per_node=1, nodes=[node("a", 1)], used_by_node={})
    assert cap.nodes == 0

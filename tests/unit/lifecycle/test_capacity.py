"""Pool capacity from Nodes and Pods."""

from __future__ import annotations

from typing import Any

from cluster_manifests import gfd_node, inference_pod
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


A100_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_partly_used_nodes_report_their_free_gpus_most_first() -> None:
    nodes = [gfd_node("a100-a"), gfd_node("a100-b"), gfd_node("a100-c"), gfd_node("a100-d"),
             gfd_node("a100-e", ready=False)]
    used = gpus_requested_by_node([
        inference_pod("llama-70b", "a100-a", 8),  # full
        inference_pod("llama-8b", "a100-b", 2), inference_pod("mistral", "a100-b", 4),  # 2 free
        inference_pod("embedder", "a100-c", 1),  # 7 free
        inference_pod("done", "a100-d", 8, phase="Succeeded"),  # finished: the node is whole again
        inference_pod("pending", "", 4, phase="Pending"),  # not bound: holds nothing yet
    ])
    cap = observe_pool_capacity(selector=A100_SELECTOR, gpus_per_node=8, nodes=nodes, used_by_node=used)
    assert (cap.nodes, cap.ready_nodes, cap.allocatable_gpus, cap.free_gpus, cap.free_whole_nodes) == (5, 4, 32, 17, 1)
    assert cap.free_gpus_on_shared_nodes == (7, 2)

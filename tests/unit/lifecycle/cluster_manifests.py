"""Realistic Node and Pod manifests for capacity tests: GPU nodes as a cloud and NVIDIA GPU Feature
Discovery label them, and GPU pods as a serving stack runs them."""

from __future__ import annotations

from typing import Any


def gfd_node(name: str, *, ready: bool = True, pool_label: str = "a100-80-ondemand") -> dict[str, Any]:
    """An 8xA100 node as a cloud and NVIDIA GPU Feature Discovery label it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "node.kubernetes.io/instance-type": "p4de.24xlarge",
            "karpenter.sh/capacity-type": "on-demand",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81920",
            "memfit.dev/pool": pool_label,
        }},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "96", "memory": "1176280764Ki", "nvidia.com/gpu": "8", "pods": "737"},
            "allocatable": {"cpu": "95690m", "memory": "1167449756Ki", "nvidia.com/gpu": "8", "pods": "737"},
            "conditions": [{"type": "MemoryPressure", "status": "False"},
                           {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
        },
    }


def inference_pod(name: str, node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    """A vLLM-style pod holding `gpus` GPUs (requests = limits), with an init container and a sidecar."""
    gpu = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "serving"},
        "spec": {
            "nodeName": node_name,
            "initContainers": [{"name": "fetch", "image": "busybox", "resources": {}}],
            "containers": [
                {"name": "server", "image": "vllm/vllm-openai",
                 "resources": {"requests": {"cpu": "8", **gpu}, "limits": {"memory": "64Gi", **gpu}}},
                {"name": "metrics", "image": "exporter", "resources": {"requests": {"cpu": "100m"}}},
            ],
        },
        "status": {"phase": phase},
    }

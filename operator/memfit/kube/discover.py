"""`memfit pools discover`: GPUNodePools from the GPU Feature Discovery labels of a cluster's nodes."""

from __future__ import annotations

import re
from typing import Any

from memfit.catalog import find_gpu

Manifest = dict[str, Any]
PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
CAPACITY_TYPES = ("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType")
SPOT_LABELS = {"cloud.google.com/gke-spot": "true", "kubernetes.azure.com/scalesetpriority": "spot"}


def _capacity(labels: dict[str, str]) -> tuple[str, dict[str, str]]:
    for key in CAPACITY_TYPES:
        if key in labels:
            value = labels[key].lower().replace("_", "-")
            return (
                "spot"
                if value == "spot"
                else "on-demand"
                if value in ("on-demand", "ondemand")
                else "reserved"
                if value == "reserved"
                else "on-demand"
            ), {key: labels[key]}
    for key, value in SPOT_LABELS.items():
        if labels.get(key) == value:
            return "spot", {key: value}
    return "on-demand", {}


def _name(product: str, per_node: int, capacity: str, instance: str) -> str:
    gpu = find_gpu(product)
    base = gpu.key if gpu else re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")
    if instance:
        base += "-" + re.sub(r"[^a-z0-9]+", "-", instance.lower()).strip("-")
    elif per_node > 1:
        base += f"-x{per_node}"
    if capacity != "on-demand":
        base += f"-{capacity}"
    return base[:63].strip("-")


def discover_pools(nodes: list[Manifest]) -> list[Manifest]:
    """One GPUNodePool per (product, GPUs per node, instance type, capacity type), sorted by name."""
    groups: dict[tuple[str, int, str, str], dict[str, Any]] = {}
    for node in nodes:
        labels: dict[str, str] = (node.get("metadata") or {}).get("labels") or {}
        product = labels.get(PRODUCT)
        if not product:
            continue
        per_node = int(labels.get(COUNT, "1") or 1)
        instance = labels.get(INSTANCE_TYPE, "")
        capacity, capacity_selector = _capacity(labels)
        key = (product, per_node, instance, capacity)
        group = groups.setdefault(
            key, {"nodes": 0, "memory": labels.get(MEMORY), "selector": capacity_selector}
        )
        group["nodes"] += 1
    pools = []
    for (product, per_node, instance, capacity), group in groups.items():
        selector = {PRODUCT: product} | ({INSTANCE_TYPE: instance} if instance else {}) | group["selector"]
        gpu: dict[str, Any] = {"product": product, "perNode": per_node}
        if group["memory"] and str(group["memory"]).isdigit():
            gpu["memoryMiB"] = int(group["memory"])
        spec: dict[str, Any] = {
            "gpu": gpu,
            "nodeSelector": selector,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "capacityType": capacity,
            "maxNodes": max(1, group["nodes"]),
        }
        known = find_gpu(product)
        if known is not None:
            spec["pricePerNodeHour"] = round(known.price_per_gpu_hour * per_node, 3)
        pools.append(
            {
                "apiVersion": "memfit.dev/v1alpha1",
                "kind": "GPUNodePool",
                "metadata": {"name": _name(product, per_node, capacity, instance)},
                "spec": spec,
            }
        )
    return sorted(pools, key=lambda p: p["metadata"]["name"])

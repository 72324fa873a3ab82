"""`memfit pools discover`: GPUNodePools from the GPU Feature Discovery labels of a cluster's nodes."""

from __future__ import annotations

import re
from typing import Any

from memfit.catalog import GPUModel, find_gpu
from memfit.mig import find_profile

Manifest = dict[str, Any]
PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_COUNT = re.compile(r"^nvidia\.com/mig-([1-7]g\.[0-9]+gb(?:\+me)?)\.count$")
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


def _mig_slices(labels: dict[str, str]) -> list[tuple[str, int, str | None]]:
    """(profile, slices on the node, MiB per slice) from GFD's labels of a `mixed`-strategy MIG node."""
    out = []
    for key, value in labels.items():
        if (found := MIG_COUNT.match(key)) and value.isdigit() and int(value) > 0:
            out.append((found.group(1), int(value), labels.get(f"nvidia.com/mig-{found.group(1)}.memory")))
    return sorted(out)


def _whole_gpus(node: Manifest, labels: dict[str, str]) -> int:
    """GPUs per node; on a `mixed` MIG node only the unpartitioned ones (the device plugin's nvidia.com/gpu)."""
    if labels.get(MIG_STRATEGY) != "mixed":
        return int(labels.get(COUNT, "1") or 1)
    allocatable = str(((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0"))
    return int(allocatable) if allocatable.isdigit() else 0


def _slice_layout(slices: int, profile: str, known: GPUModel | None) -> tuple[int, int]:
    """GFD counts a node's slices of a profile, not the GPUs they are on: the fewest GPUs that can hold
    them evenly (at most the profile's instances per GPU, from the catalog, else 7 / its compute slices),
    so that GPUs x slices per GPU = the slices, within the schema's 16 GPUs a node."""
    found = find_profile(known, profile)
    per_gpu_max = found.max_per_gpu if found is not None else 7 // int(profile[0])
    gpus = -(-slices // per_gpu_max)
    while slices % gpus:
        gpus += 1
    return gpus, slices // gpus


def discover_pools(nodes: list[Manifest]) -> list[Manifest]:
    """One GPUNodePool per (product, GPUs per node, instance type, capacity type), sorted by name; on MIG
    nodes (`mixed` strategy) one more per MIG profile, whose GPUs are the profile's slices (memfit.mig)."""
    groups: dict[tuple[str, int, str, str, str], dict[str, Any]] = {}
    for node in nodes:
        labels: dict[str, str] = (node.get("metadata") or {}).get("labels") or {}
        product = labels.get(PRODUCT)
        if not product:
            continue
        instance = labels.get(INSTANCE_TYPE, "")
        capacity, capacity_selector = _capacity(labels)
        devices = [("", _whole_gpus(node, labels), labels.get(MEMORY))]
        devices += [(f"{profile}", count, memory) for profile, count, memory in _mig_slices(labels)]
        for profile, per_node, memory in devices:
            if per_node <= 0:
                continue
            group = groups.setdefault((product, per_node, instance, capacity, profile),
                                      {"nodes": 0, "memory": memory, "selector": capacity_selector})
            group["nodes"] += 1
    pools = []
    for (product, per_node, instance, capacity, profile), group in groups.items():
        selector = {PRODUCT: product} | ({INSTANCE_TYPE: instance} if instance else {}) | group["selector"]
        gpu: dict[str, Any] = {"product": product, "perNode": per_node}
        if group["memory"] and str(group["memory"]).isdigit():
            gpu["memoryMiB"] = int(group["memory"])
        if profile:  # the node's slices as GPUs x slices per GPU, priced at their share of the GPU's compute
            gpu["perNode"], per_gpu = _slice_layout(per_node, profile, find_gpu(product))
            gpu["mig"] = {"profile": profile, "perGPU": per_gpu}
            selector[MIG_STRATEGY] = "mixed"
        spec: dict[str, Any] = {
            "gpu": gpu,
            "nodeSelector": selector,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "capacityType": capacity,
            "maxNodes": max(1, group["nodes"]),
        }
        known = find_gpu(product)
        if known is not None:
            share = int(profile[0]) / 7 if profile else 1.0
            spec["pricePerNodeHour"] = round(known.price_per_gpu_hour * share * per_node, 3)
        name = _name(product, per_node, capacity, instance)
        if profile:
            name = f"{name[:50]}-mig-{profile.replace('.', '-')}"
        pools.append(
            {
                "apiVersion": "memfit.dev/v1alpha1",
                "kind": "GPUNodePool",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    return sorted(pools, key=lambda p: p["metadata"]["name"])

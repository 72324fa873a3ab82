"""KWOK fake GPU node pools: load hack/kwok/gpu-pools.yaml, create, scale and delete the pools' Nodes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from memfit_testbed.paths import KWOK

DEFAULT_POOLS = KWOK / "gpu-pools.yaml"
POOL_LABEL = "memfit.dev/pool"
GPU = "nvidia.com/gpu"
SIMULATED_GPU_ANNOTATION = "memfit.dev/simulated-gpu"  # the pod runner passes it as MEMFIT_SIMULATED_GPU


@dataclass(frozen=True)
class MigSlices:
    """GPUs of each node partitioned into one MIG profile, as NVIDIA's device plugin (mixed strategy)
    and GPU Feature Discovery show them: `count` slices per node, each of `memory_mib`."""

    profile: str
    count: int
    memory_mib: int


@dataclass(frozen=True)
class Gpu:
    product: str
    memory_mib: int
    count: int  # whole GPUs per node (not partitioned)
    family: str = ""
    compute_major: int | None = None
    compute_minor: int | None = None
    mig: tuple[MigSlices, ...] = ()


@dataclass(frozen=True)
class Pool:
    name: str
    nodes: int
    instance_type: str
    capacity_type: str
    cpu: str
    memory: str
    zone: str = ""
    pods: str = "110"
    gpu: Gpu | None = None
    # {"fragmentation": 1.02, "contextMiB": 300}: what the pod runner's trainer pods on these nodes report
    # as a GPU's reservation and context on top of their real CPU allocator bytes (no GPU exists here).
    simulated_gpu: dict[str, float] | None = None

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Pool:
        g = d.get("gpu")
        gpu = None
        if g:
            gpu = Gpu(product=g["product"], memory_mib=int(g["memoryMiB"]), count=int(g["count"]),
                      family=g.get("family", ""), compute_major=g.get("computeMajor"),
                      compute_minor=g.get("computeMinor"),
                      mig=tuple(MigSlices(m["profile"], int(m["count"]), int(m["memoryMiB"]))
                                for m in g.get("mig", ())))
        return Pool(name=d["name"], nodes=int(d["nodes"]), instance_type=d["instanceType"],
                    capacity_type=d["capacityType"], cpu=str(d["cpu"]), memory=str(d["memory"]),
                    zone=d.get("zone", ""), pods=str(d.get("pods", "110")), gpu=gpu,
                    simulated_gpu=d.get("simulatedGpu"))

    def node_name(self, index: int) -> str:
        return f"{self.name}-{index}"

    def node(self, index: int) -> dict[str, Any]:
        """The Node manifest for node `index` of this pool."""
        labels = {
            POOL_LABEL: self.name,
            "kubernetes.io/hostname": self.node_name(index),
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            "node.kubernetes.io/instance-type": self.instance_type,
            "karpenter.sh/capacity-type": self.capacity_type,
            "karpenter.sh/nodepool": self.name,
        }
        if self.zone:
            labels["topology.kubernetes.io/zone"] = self.zone
            labels["topology.kubernetes.io/region"] = self.zone[:-1]
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods}
        taints: list[dict[str, str]] = []
        if self.gpu:
            g = self.gpu
            labels.update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": g.product,
                           "nvidia.com/gpu.memory": str(g.memory_mib), "nvidia.com/gpu.count": str(g.count)})
            if g.family:
                labels["nvidia.com/gpu.family"] = g.family
            if g.compute_major is not None:
                labels["nvidia.com/gpu.compute.major"] = str(g.compute_major)
                labels["nvidia.com/gpu.compute.minor"] = str(g.compute_minor or 0)
            resources[GPU] = str(g.count)
            if g.mig:
                labels["nvidia.com/mig.strategy"] = "mixed"
            for piece in g.mig:
                resource = f"nvidia.com/mig-{piece.profile}"
                labels |= {f"{resource}.count": str(piece.count), f"{resource}.memory": str(piece.memory_mib)}
                resources[resource] = str(piece.count)
            taints.append({"key": GPU, "value": "present", "effect": "NoSchedule"})
        annotations = {"kwok.x-k8s.io/node": "fake"}
        if self.simulated_gpu is not None:
            annotations[SIMULATED_GPU_ANNOTATION] = json.dumps(self.simulated_gpu, sort_keys=True)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name(index), "labels": labels, "annotations": annotations},
            "spec": {"taints": taints},
            "status": {"capacity": dict(resources), "allocatable": dict(resources)},
        }


def load_pools(path: Path = DEFAULT_POOLS) -> dict[str, Pool]:
    """The pools declared in `path`, by name."""
    data = yaml.safe_load(path.read_text())
    pools = [Pool.from_dict(p) for p in data["pools"]]
    return {p.name: p for p in pools}


def core_api(kubeconfig: str | None = None) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))


def _raw(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return dict(json.loads(call(*args, _preload_content=False, **kwargs).data))


def pool_nodes(api: client.CoreV1Api, pool: str) -> list[str]:
    """Names of the Nodes of `pool`, by index."""
    nodes = _raw(api.list_node, label_selector=f"{POOL_LABEL}={pool}")["items"]
    return sorted((str(n["metadata"]["name"]) for n in nodes), key=lambda n: (len(n), n))


def scale_pool(api: client.CoreV1Api, pool: Pool, count: int, wait: float = 60.0) -> list[str]:
    """Create or delete Nodes so that `pool` has exactly `count` (indices 0..count-1); wait until Ready."""
    have = set(pool_nodes(api, pool.name))
    want = {pool.node_name(i) for i in range(count)}
    for i in range(count):
        if pool.node_name(i) not in have:
            _create_node(api, pool.node(i))
    for name in have - want:
        delete_node(api, name)
    if wait:
        wait_nodes_ready(api, sorted(want), wait)
    return sorted(want, key=lambda n: (len(n), n))


def delete_pool(api: client.CoreV1Api, pool: str) -> None:
    for name in pool_nodes(api, pool):
        delete_node(api, name)


def delete_node(api: client.CoreV1Api, name: str) -> None:
    """Delete a Node and force-delete its pods, as when a cloud node goes away (no kubelet to finish them)."""
    try:
        api.delete_node(name)
    except ApiException as e:
        if e.status != 404:
            raise
    for pod in _raw(api.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}")["items"]:
        meta = pod["metadata"]
        try:
            now = client.V1DeleteOptions(grace_period_seconds=0)
            api.delete_namespaced_pod(meta["name"], meta["namespace"], body=now)
        except ApiException as e:
            if e.status != 404:
                raise


def _create_node(api: client.CoreV1Api, manifest: dict[str, Any]) -> None:
    # Status is ignored on create; write it with the status subresource so the scheduler sees the GPUs
    # at once (kwok's node-initialize keeps user-supplied capacity/allocatable).
    try:
        api.create_node(client.V1Node.model_validate(manifest))
    except ApiException as e:
        if e.status != 409:
            raise
    api.patch_node_status(manifest["metadata"]["name"], {"status": manifest["status"]},
                          _content_type="application/merge-patch+json")


def wait_nodes_ready(api: client.CoreV1Api, names: list[str], timeout: float = 60.0) -> None:
    """Wait until each node is Ready and carries no not-ready/unreachable taint."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        for name in sorted(pending):
            try:
                node = _raw(api.read_node, name)
            except ApiException as e:
                if e.status == 404:
                    continue
                raise
            conds = (node.get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
            taints = (node.get("spec") or {}).get("taints") or []
            bad = [t["key"] for t in taints if t["key"].startswith("node.kubernetes.io/")]
            if ready and not bad:
                pending.discard(name)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout:.0f}s: {sorted(pending)} (is kwok running?)")
        if pending:
            time.sleep(0.2)


def apply_pools(kubeconfig: str | None = None, path: Path = DEFAULT_POOLS, wait: float = 60.0) -> list[str]:
    """Create every pool of `path` at its declared size; returns all node names."""
    api = core_api(kubeconfig)
    names: list[str] = []
    for pool in load_pools(path).values():
        names += scale_pool(api, pool, pool.nodes, wait=0)
    if wait:
        wait_nodes_ready(api, names, wait)
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", default=None)
    ap.add_argument("--pools", type=Path, default=DEFAULT_POOLS)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("apply", help="create every pool at its declared size")
    sc = sub.add_parser("scale", help="set a pool's node count")
    sc.add_argument("pool")
    sc.add_argument("count", type=int)
    de = sub.add_parser("delete", help="delete a pool's nodes")
    de.add_argument("pool")
    args = ap.parse_args(argv)
    if args.cmd == "apply":
        print("\n".join(apply_pools(args.kubeconfig, args.pools)))
    elif args.cmd == "scale":
        print("\n".join(scale_pool(core_api(args.kubeconfig), load_pools(args.pools)[args.pool], args.count)))
    else:
        delete_pool(core_api(args.kubeconfig), args.pool)
    return 0


if __name__ == "__main__":
    sys.exit(main())

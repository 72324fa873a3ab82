"""Kueue objects from GPUNodePools: one ResourceFlavor per pool, and an example ClusterQueue/LocalQueue.

The contract that keeps memfit and Kueue from disagreeing (docs/kueue.md): a pool's ResourceFlavor has
the pool's name and `nodeLabels` equal to the pool's `nodeSelector`. memfit puts that selector on every
pod it plans onto the pool; Kueue only assigns a flavor whose nodeLabels do not contradict the pod's
nodeSelector, and on admission injects the flavor's nodeLabels (the same labels) into the pod template.
So the flavor Kueue picks for a memfit Job is always the planned pool's, and the selector is unchanged —
provided no pool's selector is contained in another's (then the other flavor would match too), which
`build_kueue_setup` refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memfit.api.pool import GPUNodePool
from memfit.kube.common import GPU_RESOURCE, GPU_TOLERATION, Manifest

KUEUE_API = "kueue.x-k8s.io/v1beta2"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
# memfit's pods request GPUs, and host memory when a plan offloads; Kueue refuses a workload that
# requests a resource its ClusterQueue does not cover, so the example covers CPU and memory too, with
# quotas meant not to bind (the GPU quota is the one that matters).
UNBOUND_CPU = "1000"
UNBOUND_MEMORY = "64Ti"


class KueueConfigError(ValueError):
    """A pool or quota that cannot become a Kueue object; the message names the field."""


def build_resource_flavor(pool: GPUNodePool) -> Manifest:
    """ResourceFlavor `<pool>`: nodeLabels = the pool's nodeSelector, tolerations = the pool's (plus
    the GPU taint's, which memfit adds to every GPU pod)."""
    name = pool.metadata.name
    if not pool.spec.node_selector:
        raise KueueConfigError(
            f"GPUNodePool {name}: spec.nodeSelector is empty; a ResourceFlavor needs the labels that select "
            "the pool's nodes (memfit's nodeSelector and the flavor's nodeLabels must be the same)"
        )
    tolerations = [t.to_wire() for t in pool.spec.tolerations]
    if not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append(dict(GPU_TOLERATION))
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "memfit"}},
        "spec": {"nodeLabels": dict(sorted(pool.spec.node_selector.items())), "tolerations": tolerations},
    }


def pool_gpus(pool: GPUNodePool) -> int:
    """Every GPU the pool can provide: maxNodes x GPUs per node."""
    return pool.spec.max_nodes * pool.spec.gpu.per_node


def build_cluster_queue(
    name: str, pools: Sequence[GPUNodePool], *, gpu_quota: Mapping[str, int] | None = None
) -> Manifest:
    """ClusterQueue `name` with one flavor per pool (in the order given) in a single resource group;
    each flavor's `nvidia.com/gpu` nominal quota is `gpu_quota[pool]`, else all the pool's GPUs."""
    quota = dict(gpu_quota or {})
    names = [p.metadata.name for p in pools]
    if unknown := sorted(set(quota) - set(names)):
        raise KueueConfigError(f"--gpu-quota: no GPUNodePool named {', '.join(unknown)} (pools: {', '.join(names)})")
    if negative := sorted(k for k, v in quota.items() if v < 0):
        raise KueueConfigError(f"--gpu-quota: {', '.join(negative)}: a quota must be 0 or more GPUs")
    flavors = [
        {"name": pool.metadata.name, "resources": [
            {"name": "cpu", "nominalQuota": UNBOUND_CPU},
            {"name": "memory", "nominalQuota": UNBOUND_MEMORY},
            {"name": GPU_RESOURCE, "nominalQuota": quota.get(pool.metadata.name, pool_gpus(pool))},
        ]}
        for pool in pools
    ]  # fmt: skip
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU_RESOURCE], "flavors": flavors}],
        },
    }


def build_local_queue(name: str, namespace: str, cluster_queue: str) -> Manifest:
    """LocalQueue `namespace/name` feeding `cluster_queue` (what `scheduling.kueueQueue` names)."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def build_kueue_setup(
    pools: Sequence[GPUNodePool],
    *,
    cluster_queue: str = "memfit",
    local_queue: str = "memfit",
    namespace: str = "default",
    gpu_quota: Mapping[str, int] | None = None,
) -> list[Manifest]:
    """ResourceFlavors for `pools` (sorted by name), then the ClusterQueue and the LocalQueue."""
    if not pools:
        raise KueueConfigError("no GPUNodePools: nothing to make flavors from")
    ordered = sorted(pools, key=lambda p: p.metadata.name)
    for a in ordered:
        for b in ordered:
            if a is not b and a.spec.node_selector.items() <= b.spec.node_selector.items():
                raise KueueConfigError(
                    f"GPUNodePool {a.metadata.name}: spec.nodeSelector {dict(a.spec.node_selector)} is contained in "
                    f"{b.metadata.name}'s {dict(b.spec.node_selector)}; Kueue could then admit a Job planned for "
                    f"{a.metadata.name} on flavor {b.metadata.name} (and move it there): give each pool a label "
                    "the others do not match"
                )
    return [
        *(build_resource_flavor(p) for p in ordered),
        build_cluster_queue(cluster_queue, ordered, gpu_quota=gpu_quota),
        build_local_queue(local_queue, namespace, cluster_queue),
    ]

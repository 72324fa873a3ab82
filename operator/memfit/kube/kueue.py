"""Kueue objects from GPUNodePools: one ResourceFlavor per pool, and an example ClusterQueue/LocalQueue.

The contract that keeps memfit and Kueue from disagreeing (docs/kueue.md): a pool's ResourceFlavor has
the pool's name and `nodeLabels` equal to the pool's `nodeSelector`. memfit puts that selector on every
pod it plans onto the pool; Kueue only assigns a flavor whose nodeLabels do not contradict the pod's
nodeSelector, and on admission injects the flavor's nodeLabels (the same labels) into the pod template.
So the flavor Kueue picks for a memfit Job is always the planned pool's, and the selector is unchanged —
provided no pool's selector is contained in another's (then the other flavor would match too), which
`build_kueue_setup` refuses among pools whose pods request the same resource.

GPUs by memory (docs/mig.md, docs/dra.md): a MIG pool's pods request `nvidia.com/mig-<profile>`, so its
flavor holds quota in that resource (and none in the others); MIG pools over the same nodes as the
whole-GPU pool may then share its selector, because Kueue only assigns a flavor with quota in what the
pod requests. A DRA pool's pods request no extended resource: Kueue counts the devices of their
ResourceClaimTemplates per DeviceClass and charges them to the resource its Configuration's
`resources.deviceClassMappings` maps the class to. memfit's convention is the device plugin's name
(`nvidia.com/gpu`, or `nvidia.com/mig-<profile>` for a MIG pool), so a pool's quota reads the same in
both modes; `device_class_mappings` is the Configuration fragment for the DRA pools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memfit.api.pool import GPUNodePool
from memfit.catalog import find_gpu
from memfit.kube.common import GPU_RESOURCE, GPU_TOLERATION, Manifest
from memfit.mig import devices_per_node, resource_name

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
    """Every device the pool can provide: maxNodes x GPUs (a MIG pool: slices) per node."""
    gpu = pool.spec.gpu
    return pool.spec.max_nodes * devices_per_node(gpu, find_gpu(gpu.product))


def quota_resource(pool: GPUNodePool) -> str:
    """The resource a pool's flavor holds quota in: what its pods request through the device plugin
    (`nvidia.com/gpu`, `nvidia.com/mig-<profile>`), and for a DRA pool the same name, which Kueue's
    deviceClassMappings must map the pool's DeviceClass to."""
    return resource_name(pool.spec.gpu)


def device_class_mappings(pools: Sequence[GPUNodePool]) -> list[dict[str, object]]:
    """Kueue Configuration `resources.deviceClassMappings` for the DRA pools: each quota resource with
    the DeviceClasses charged to it. Kueue maps a DeviceClass to one resource, so two DRA pools whose
    class is the same but whose quota resources differ (MIG profiles of one `mig.nvidia.com` class)
    are refused: give each profile its own DeviceClass."""
    classes: dict[str, tuple[str, str]] = {}  # class -> (resource, pool)
    for pool in sorted(pools, key=lambda p: p.metadata.name):
        dra = pool.spec.gpu.dra
        if dra is None:
            continue
        resource = quota_resource(pool)
        seen = classes.setdefault(dra.device_class_name, (resource, pool.metadata.name))
        if seen[0] != resource:
            raise KueueConfigError(
                f"GPUNodePool {pool.metadata.name}: spec.gpu.dra.deviceClassName {dra.device_class_name!r} is "
                f"also the class of GPUNodePool {seen[1]}, whose quota resource is {seen[0]} (this pool's: "
                f"{resource}); Kueue charges a DeviceClass to one resource, so give each MIG profile its own "
                "DeviceClass (a selector on the profile attribute) and name it in its pool"
            )
    by_resource: dict[str, list[str]] = {}
    for device_class, (resource, _) in sorted(classes.items()):
        by_resource.setdefault(resource, []).append(device_class)
    return [{"name": r, "deviceClassNames": c} for r, c in sorted(by_resource.items())]


def build_cluster_queue(
    name: str, pools: Sequence[GPUNodePool], *, gpu_quota: Mapping[str, int] | None = None
) -> Manifest:
    """ClusterQueue `name` with one flavor per pool (in the order given) in a single resource group
    covering cpu, memory and every pool's quota resource (`nvidia.com/gpu` first, then the MIG
    profiles'); each flavor's quota in its own pool's resource is `gpu_quota[pool]`, else all the
    pool's devices, and 0 in the others (Kueue refuses a flavor that does not list every covered
    resource, and assigns a flavor only where the pod's request fits its quota)."""
    quota = dict(gpu_quota or {})
    names = [p.metadata.name for p in pools]
    if unknown := sorted(set(quota) - set(names)):
        raise KueueConfigError(f"--gpu-quota: no GPUNodePool named {', '.join(unknown)} (pools: {', '.join(names)})")
    if negative := sorted(k for k, v in quota.items() if v < 0):
        raise KueueConfigError(f"--gpu-quota: {', '.join(negative)}: a quota must be 0 or more GPUs")
    gpu_resources = sorted({quota_resource(p) for p in pools}, key=lambda r: (r != GPU_RESOURCE, r))
    flavors = [
        {"name": pool.metadata.name, "resources": [
            {"name": "cpu", "nominalQuota": UNBOUND_CPU},
            {"name": "memory", "nominalQuota": UNBOUND_MEMORY},
            *({"name": r, "nominalQuota": quota.get(pool.metadata.name, pool_gpus(pool)) if r == quota_resource(pool) else 0}
              for r in gpu_resources),
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
            "resourceGroups": [{"coveredResources": ["cpu", "memory", *gpu_resources], "flavors": flavors}],
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
    device_class_mappings(ordered)  # refuses DRA pools Kueue could not charge apart
    for a in ordered:
        for b in ordered:
            if (a is not b and quota_resource(a) == quota_resource(b)
                    and a.spec.node_selector.items() <= b.spec.node_selector.items()):
                raise KueueConfigError(
                    f"GPUNodePool {a.metadata.name}: spec.nodeSelector {dict(a.spec.node_selector)} is contained in "
                    f"{b.metadata.name}'s {dict(b.spec.node_selector)}; Kueue could then admit a Job planned for "
                    f"{a.metadata.name} on flavor {b.metadata.name} (and move it there): give each pool a label "
                    f"the others requesting {quota_resource(a)} do not match"
                )
    return [
        *(build_resource_flavor(p) for p in ordered),
        build_cluster_queue(cluster_queue, ordered, gpu_quota=gpu_quota),
        build_local_queue(local_queue, namespace, cluster_queue),
    ]

"""GPUNodePools resolved into offers: memory, throughput, price and links per pool, with catalog
defaults for known products. A pool that cannot be planned on is rejected with a reason, never an
exception.

Pricing: a job using all GPUs of n nodes pays n x pricePerNodeHour. A single-node job may use k of a
node's G GPUs (k a power of two below G, as clouds sell 1/2/4/8-GPU sizes) and is charged k/G of the
node price: the remaining GPUs stay schedulable for other pods. With live capacity (`FreeGpus`), such a
part-node layout may also go on a node other pods already use, when one has that many GPUs free; the
plan then says so (`Layout.shared_node`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from memfit.api.common import Checkpointing, Precision
from memfit.api.job import ObjectMeta
from memfit.api.pod_template import PodTemplate
from memfit.api.pool import (
    GPUNodePool,
    GPUNodePoolSpec,
    GPUSpec,
    HostSpec,
    InterconnectSpec,
    IntraNode,
)
from memfit.api.profile import Profile
from memfit.catalog import GpuCatalog, GPUModel
from memfit.mig import WHOLE_GPU_RESOURCE, MigSlice, resolve_slice
from memfit.planner.measured import DeviceTerms
from memfit.timing.step import (
    DEFAULT_MATMUL_EFFICIENCY,
    NVLINK_GBPS,
    PCIE_GBPS,
    UNKNOWN_HBM_GBPS,
    UNKNOWN_SM_COUNT,
    GpuSpeed,
)

GIB = 1024**3
MIB = 1024**2
# Throughput assumed for a product memfit does not know and the pool does not describe.
UNKNOWN_BF16_TFLOPS = 100.0
# fp32 CUDA-core throughput of an unknown GPU relative to its bf16 tensor cores (A100/H100 ~1/16,
# L4 ~1/4; a conservative middle).
UNKNOWN_FP32_RATIO = 1 / 10
# Inter-node bandwidth when a pool does not say: nvlink-class nodes sit on fast fabrics.
DEFAULT_INTER_NODE_GBITS = {IntraNode.NVLINK: 400.0, IntraNode.PCIE: 100.0}
# Share of host RAM memfit lets offload use (the rest is the OS, kubelet, dataloaders).
HOST_USABLE_FRACTION = 0.9
# GPUs per node of the offline catalog pools (the large instance of each family).
CATALOG_GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class FreeGpus:
    """What a new attempt can get on one pool now: whole free nodes (with those the pool may still add)
    and the free GPUs of its partly used nodes, most first."""

    whole_nodes: int
    on_shared_nodes: tuple[int, ...] = ()
    # A cap on the GPUs of one plan on top of the free nodes (a Kueue ClusterQueue's free quota there).
    max_gpus: int | None = None

    @property
    def most_on_a_shared_node(self) -> int:
        return self.on_shared_nodes[0] if self.on_shared_nodes else 0

    @property
    def any(self) -> bool:
        return self.whole_nodes > 0 or self.most_on_a_shared_node > 0


@dataclass(frozen=True, slots=True)
class Layout:
    """How many nodes and GPUs a candidate uses, and what that costs per hour."""

    nodes: int
    gpus_per_node: int
    price_per_hour: float
    world_size: int = 0  # nodes x GPUs per node (filled in by __post_init__)
    # Part of one node that other pods already use (its free GPUs were counted live).
    shared_node: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "world_size", self.nodes * self.gpus_per_node)


@dataclass(frozen=True, slots=True)
class Offer:
    """One pool as the planner sees it."""

    pool: str
    product: str
    usable_bytes: int
    gpus_per_node: int
    max_nodes: int
    price_per_node_hour: float
    host_bytes_per_node: int | None  # None: unknown, so no host offload
    nvme_bytes_per_node: int
    speed: GpuSpeed
    supports_bf16: bool
    max_gpus: int | None = None  # free GPUs right now, when the caller caps by capacity
    free: FreeGpus | None = None  # free nodes and shared-node GPUs right now (live capacity)
    interruption_rate_per_hour: float = 0.0  # per node (spot reclaims), priced as risk (planner.interruptions)
    capacity_type: str = "on-demand"
    notes: tuple[str, ...] = ()
    # Measured device terms of this GPU product (planner.measured): `usable_bytes` is then the budget
    # they leave for an uncorrected prediction, and this is the GPU's own usable memory.
    device: DeviceTerms | None = None
    physical_usable_bytes: int | None = None
    # The extended resource a pod requests (a MIG profile's for a slice pool), and whether a plan is one
    # process on one device (a MIG slice: NCCL does not run across MIG instances).
    gpu_resource: str = WHOLE_GPU_RESOURCE
    mig_profile: str | None = None
    # (precision, checkpointing) pairs the job's profile could not run on this GPU product (Profile.skipped).
    refused: frozenset[tuple[Precision, Checkpointing]] = frozenset()

    @property
    def usable_gib(self) -> float:
        return self.usable_bytes / GIB

    @property
    def host_usable_bytes_per_node(self) -> int:
        """Host RAM offload may use on one node."""
        return int((self.host_bytes_per_node or 0) * HOST_USABLE_FRACTION)

    def layouts(self, max_nodes: int | None = None) -> list[Layout]:
        """Partial single nodes (1, 2, 4, ... GPUs) then whole nodes 1..max_nodes, fewest GPUs first,
        within the free GPUs when known: a part of a node needs a free node or a shared node with that
        many GPUs free (it goes on the shared one: the free node stays whole); n whole nodes need n free."""
        per_node = self.gpus_per_node
        free = self.free
        top = self.max_nodes if max_nodes is None else min(self.max_nodes, max_nodes)
        if free is not None:
            top = min(top, free.whole_nodes)
        if self.mig_profile is not None:  # one slice, one process
            shared = free is not None and free.most_on_a_shared_node >= 1
            if free is None or shared or free.whole_nodes > 0:
                return [Layout(1, 1, self.price_per_node_hour / per_node, shared_node=shared)]
            return []
        out: list[Layout] = []
        k = 1
        while k < per_node:
            shared = free is not None and free.most_on_a_shared_node >= k
            if free is None or shared or free.whole_nodes > 0:
                out.append(Layout(1, k, self.price_per_node_hour * k / per_node, shared_node=shared))
            k *= 2
        for nodes in range(1, top + 1):
            out.append(Layout(nodes, per_node, self.price_per_node_hour * nodes))
        if self.max_gpus is not None:
            out = [layout for layout in out if layout.world_size <= self.max_gpus]
        return out


@dataclass(frozen=True, slots=True)
class PoolRejection:
    """A pool the planner could not use, and why, in plain words."""

    pool: str
    reason: str

    def __str__(self) -> str:
        return f"{self.pool}: {self.reason}"


def _slice_speed(speed: GpuSpeed, piece: MigSlice) -> GpuSpeed:
    """A MIG slice's rates: its SM share of the compute, its memory share of the bandwidth."""
    c = piece.compute_fraction
    return replace(speed, bf16_tflops=speed.bf16_tflops * c, fp16_tflops=speed.fp16_tflops * c,
                   fp32_tflops=speed.fp32_tflops * c, tf32_tflops=speed.tf32_tflops * c,
                   sm_count=max(1, round(speed.sm_count * c)), hbm_gbps=speed.hbm_gbps * piece.memory_fraction)


def _speed(spec: GPUNodePoolSpec, gpu: GPUModel | None) -> tuple[GpuSpeed, bool, list[str]]:
    notes: list[str] = []
    bf16 = spec.gpu.bf16_tflops
    if bf16 is None:
        if gpu is not None:
            bf16 = gpu.bf16_tflops
        else:
            bf16 = UNKNOWN_BF16_TFLOPS
            notes.append(f"throughput unknown: assumed {UNKNOWN_BF16_TFLOPS:.0f} bf16 TFLOPS (set gpu.bf16TFLOPS)")
    tf32 = gpu.tf32_tflops if gpu is not None else 0.0
    if gpu is not None:
        fp16 = gpu.fp16_tflops
        fp32 = gpu.fp32_tflops
    else:
        fp16 = bf16 or UNKNOWN_BF16_TFLOPS
        fp32 = fp16 * UNKNOWN_FP32_RATIO
    if gpu is not None and spec.gpu.bf16_tflops:
        # The pool overrides the tensor-core figure (a power-capped or down-clocked part): scale fp16 and
        # fp32 alike. bf16TFLOPS 0 only says the GPU has no bf16; fp16 and fp32 stay the catalog's.
        ratio = spec.gpu.bf16_tflops / (gpu.bf16_tflops or gpu.fp16_tflops)
        fp16, fp32, tf32 = fp16 * ratio, fp32 * ratio, tf32 * ratio
    intra = spec.interconnect.intra_node or (IntraNode(gpu.intra_node) if gpu else IntraNode.PCIE)
    inter = spec.interconnect.inter_node_gbps or (
        gpu.network_gbits_per_node if gpu is not None else DEFAULT_INTER_NODE_GBITS[intra])
    pcie = gpu.pcie_gbps if gpu is not None else PCIE_GBPS
    nvlink = (gpu.nvlink_gbps if gpu is not None and gpu.nvlink_gbps else NVLINK_GBPS)
    if gpu is None and spec.gpu.memory_bandwidth_g_bps is None:
        notes.append(f"memory bandwidth unknown: assumed {UNKNOWN_HBM_GBPS:.0f} GB/s (set gpu.memoryBandwidthGBps)")
    speed = GpuSpeed(
        bf16_tflops=bf16,
        fp16_tflops=fp16,
        fp32_tflops=fp32,
        tf32_tflops=tf32,
        intra_node_gbps=nvlink if intra == IntraNode.NVLINK else pcie,
        inter_node_gbits=inter,
        pcie_gbps=pcie,
        hbm_gbps=spec.gpu.memory_bandwidth_g_bps or (gpu.hbm_gbps if gpu is not None else UNKNOWN_HBM_GBPS),
        sm_count=gpu.sm_count if gpu is not None else UNKNOWN_SM_COUNT,
        matmul_efficiency=gpu.matmul_efficiency if gpu is not None else DEFAULT_MATMUL_EFFICIENCY,
        flash_attention=gpu.flash_attention if gpu is not None else bf16 > 0,
        architecture=gpu.architecture if gpu is not None else "ampere",
    )
    return speed, bf16 > 0, notes


def interruption_rate(spec: GPUNodePoolSpec, catalog: GpuCatalog) -> float:
    """Interruptions per node-hour: the pool's own figure, else the catalog's for its capacity type."""
    if spec.interruption_rate_per_hour is not None:
        return spec.interruption_rate_per_hour
    return catalog.interruption_rate(spec.capacity_type.value)


def resolve_offer(pool: GPUNodePool, *, catalog: GpuCatalog,
                  free_gpus: int | FreeGpus | None = None) -> Offer | PoolRejection:
    """One pool -> an Offer (unset GPU fields from `catalog`), or a rejection that says what to fix.
    `free_gpus`: a cap on the GPUs a plan may use, or the pool's free nodes and shared-node GPUs."""
    name, spec = pool.metadata.name, pool.spec
    gpu = catalog.find(spec.gpu.product)
    product = gpu.product if gpu else spec.gpu.product
    if spec.gpu.memory_mi_b is None and gpu is None:
        return PoolRejection(
            name, f"GPU product {spec.gpu.product!r} is not in the built-in catalog and gpu.memoryMiB is not set; "
            "set gpu.memoryMiB (and pricePerNodeHour)",
        )
    usable_mib = spec.gpu.memory_mi_b if spec.gpu.memory_mi_b is not None else (gpu.usable_mib if gpu else 0)
    piece: MigSlice | None = None
    if spec.gpu.mig is not None:
        resolved_slice = resolve_slice(spec.gpu, gpu)
        if isinstance(resolved_slice, str):
            return PoolRejection(name, resolved_slice)
        piece, usable_mib = resolved_slice, resolved_slice.usable_mib
    if usable_mib <= 0:
        return PoolRejection(name, "gpu.memoryMiB is 0: a GPU without memory cannot hold a training job")
    gpus = spec.gpu.per_node
    per_node = gpus * piece.per_gpu if piece is not None else gpus  # what a node offers pods
    price = spec.price_per_node_hour
    if price is None:
        if gpu is None:
            return PoolRejection(name, f"no price: {spec.gpu.product!r} is not in the catalog; set pricePerNodeHour")
        price = gpu.price_per_gpu_hour * gpus
    if price < 0:
        return PoolRejection(name, f"pricePerNodeHour is negative ({price}); set the real price per node-hour")
    if price == 0:
        return PoolRejection(
            name, "pricePerNodeHour is 0: every plan on it would cost $0; set its real (or amortised) price",
        )
    max_nodes = spec.max_nodes
    if max_nodes <= 0:
        return PoolRejection(name, "maxNodes is 0")
    free = free_gpus if isinstance(free_gpus, FreeGpus) else None
    max_gpus = free_gpus if isinstance(free_gpus, int) else (free.max_gpus if free is not None else None)
    if (max_gpus is not None and max_gpus <= 0) or (free is not None and not free.any):
        return PoolRejection(name, "no free GPUs right now")
    host_gib = spec.host.memory_gi_b
    if host_gib is None and gpu is not None:
        host_gib = gpu.host_memory_gib_per_gpu * gpus
    nvme_gib = spec.host.nvme_gi_b
    if nvme_gib is None:
        nvme_gib = gpu.nvme_gib_per_gpu * gpus if gpu is not None else 0
    host_bytes = host_gib * GIB if host_gib is not None else None
    nvme_bytes = nvme_gib * GIB
    speed, bf16, notes = _speed(spec, gpu)
    if piece is not None:  # one slice: its share of the node's host RAM and NVMe, its share of the GPU
        host_bytes = host_bytes // per_node if host_bytes is not None else None
        nvme_bytes //= per_node
        speed = _slice_speed(speed, piece)
        product = f"{product}-MIG-{piece.profile}"  # GPU Feature Discovery's name for a MIG device
    return Offer(
        pool=name,
        product=product,
        usable_bytes=usable_mib * MIB,
        gpus_per_node=per_node,
        max_nodes=max_nodes,
        max_gpus=max_gpus,
        free=free,
        interruption_rate_per_hour=interruption_rate(spec, catalog),
        capacity_type=spec.capacity_type.value,
        price_per_node_hour=price,
        host_bytes_per_node=host_bytes,
        nvme_bytes_per_node=nvme_bytes,
        speed=speed,
        supports_bf16=bf16,
        notes=tuple(notes),
        gpu_resource=piece.resource if piece is not None else WHOLE_GPU_RESOURCE,
        mig_profile=piece.profile if piece is not None else None,
    )


def with_profile_refusals(offer: Offer, profile: Profile | None, catalog: GpuCatalog) -> Offer:
    """The offer with what the job's profile could not run on its GPU product (Profile.skipped). Only a
    profile taken on that product refuses anything: a CPU kernel's (or another GPU's) gaps say nothing of it."""
    if profile is None or not profile.skipped or not profile.device.startswith("cuda:"):
        return offer
    name = profile.device.removeprefix("cuda:")
    gpu = catalog.find(name)
    if offer.product != (gpu.product if gpu is not None else name):
        return offer
    return replace(offer, refused=profile.refused())


def resolve_offers(
    pools: Sequence[GPUNodePool], *, catalog: GpuCatalog, allowed: Sequence[str] = (),
    free_gpus: Mapping[str, int | FreeGpus] | None = None, template: PodTemplate | None = None,
) -> tuple[list[Offer], list[PoolRejection]]:
    """Offers for the pools named in `allowed` (all when empty), sorted by name, and rejections.

    `template`: the job's spec.podTemplate; a pool whose node selector contradicts its nodeSelector terms
    is rejected (no node of it could take the pods).

    `free_gpus` (pool -> a GPU cap, or free nodes and shared-node GPUs from live capacity) limits the
    layouts; a pool absent from it is not limited.
    """
    offers: list[Offer] = []
    rejections: list[PoolRejection] = []
    names = {p.metadata.name for p in pools}
    for missing in sorted(set(allowed) - names):
        rejections.append(PoolRejection(missing, "named in placement.nodePools but no such GPUNodePool exists"))
    for pool in sorted(pools, key=lambda p: p.metadata.name):
        if allowed and pool.metadata.name not in allowed:
            continue
        if template is not None and (conflicts := template.selector_conflicts(pool.spec.node_selector)):
            rejections.append(PoolRejection(pool.metadata.name, "spec.podTemplate.nodeSelector asks "
                                            f"{', '.join(conflicts)}, which its nodeSelector contradicts"))
            continue
        free = free_gpus.get(pool.metadata.name) if free_gpus is not None else None
        resolved = resolve_offer(pool, catalog=catalog, free_gpus=free)
        if isinstance(resolved, PoolRejection):
            rejections.append(resolved)
        else:
            offers.append(resolved)
    return offers, rejections


def catalog_pool(gpu: GPUModel, *, gpus_per_node: int = CATALOG_GPUS_PER_NODE, max_nodes: int = 8) -> GPUNodePool:
    """A GPUNodePool for one catalog GPU, named by its key, priced at the catalog's list price."""
    intra = IntraNode(gpu.intra_node)
    return GPUNodePool(
        metadata=ObjectMeta(name=gpu.key),
        spec=GPUNodePoolSpec(
            gpu=GPUSpec(product=gpu.product, per_node=gpus_per_node),
            price_per_node_hour=round(gpu.price_per_gpu_hour * gpus_per_node, 4),
            max_nodes=max_nodes,
            host=HostSpec(
                memory_gi_b=gpu.host_memory_gib_per_gpu * gpus_per_node,
                nvme_gi_b=gpu.nvme_gib_per_gpu * gpus_per_node,
            ),
            interconnect=InterconnectSpec(intra_node=intra, inter_node_gbps=DEFAULT_INTER_NODE_GBITS[intra]),
        ),
    )


def catalog_pools(catalog: GpuCatalog, *, gpus_per_node: int = CATALOG_GPUS_PER_NODE,
                  max_nodes: int = 8) -> list[GPUNodePool]:
    """One pool per catalog GPU (offline planning): 8 GPUs per node, of which a job may use 1, 2, 4 or 8."""
    return [catalog_pool(g, gpus_per_node=gpus_per_node, max_nodes=max_nodes) for g in catalog]

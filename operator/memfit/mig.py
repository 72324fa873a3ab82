"""MIG slices as GPUs: the profiles of the MIG-capable GPUs in the catalog, and what one slice of a pool is.

Multi-Instance GPU splits an A100, H100, H200 or B200 into up to seven isolated instances, each with
its own share of the SMs and of the memory (and its memory bandwidth and L2). NVIDIA's device plugin,
with the `mixed` MIG strategy, advertises each profile as its own extended resource
(`nvidia.com/mig-1g.10gb`), and a pod asks for a slice like it asks for a GPU. A MIG GPUNodePool
(`gpu.mig.profile`) is a pool whose "GPUs" are the slices of one profile: the planner sees each slice
as a small GPU with its memory, its share of the compute, the pod requests that resource, and memfit
counts its free slices. One process per slice: NCCL does not run across MIG instances, so a plan on a
slice pool is single-process.

Profile geometry, from NVIDIA's MIG User Guide, "Supported MIG Profiles" (docs.nvidia.com/datacenter/
tesla/mig-user-guide/supported-mig-profiles.html): the same six profiles on every 7-compute-slice GPU,
each as (fraction of the SMs in sevenths, fraction of the memory in eighths, instances per GPU):
1g (small memory) 1/7, 1/8, 7; 1g (double memory) 1/7, 2/8, 4; 2g 2/7, 2/8, 3; 3g 3/7, 4/8, 2;
4g 4/7, 4/8, 1; 7g 7/7, 8/8, 1. The names carry the memory of each GPU (A100-40GB `1g.5gb` ... `7g.40gb`;
A100-80GB and H100 `1g.10gb` ... `7g.80gb`; H200 `1g.18gb` ...; B200 `1g.23gb` ..., the latter as the
NVIDIA GPU Operator's mig-parted configuration names them). The `+me` variants (media engines) have
the same compute and memory; they are not listed (a pool may still describe one with its own fields).

A slice's usable memory defaults to its memory fraction of the whole GPU's usable memory; what the
driver reports inside the slice can be a little less, and GPU Feature Discovery labels it on each node
(`nvidia.com/mig-<profile>.memory`, MiB): set `gpu.memoryMiB` from that label (`memfit pools discover`
does). Its memory bandwidth is its memory fraction of the GPU's (the memory slices each have their own
controllers), its compute the SM fraction of the GPU's rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from memfit.api.pool import GPUSpec
from memfit.catalog import GPUModel

RESOURCE_PREFIX = "nvidia.com/mig-"
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"

# (SM sevenths, memory eighths, instances per GPU), in the order of the names below.
_GEOMETRY: tuple[tuple[int, int, int], ...] = ((1, 1, 7), (1, 2, 4), (2, 2, 3), (3, 4, 2), (4, 4, 1), (7, 8, 1))
_NAMES: dict[str, tuple[str, ...]] = {
    "a100-40": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "a100-80": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "h100-80": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "h100-pcie": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "h200": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    "b200": ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one GPU: its name, its share of the SMs and of the memory, and how many fit."""

    name: str
    compute_fraction: Fraction
    memory_fraction: Fraction
    max_per_gpu: int


@dataclass(frozen=True, slots=True)
class MigSlice:
    """What one slice of a MIG pool is, resolved from the pool's fields and the catalog."""

    profile: str
    resource: str  # the device plugin's extended resource, nvidia.com/mig-<profile>
    per_gpu: int
    usable_mib: int
    compute_fraction: float
    memory_fraction: float


def profiles(gpu: GPUModel | None) -> tuple[MigProfile, ...]:
    """The MIG profiles of a catalog GPU (none for a GPU without MIG: T4, L4, A10G, L40S, V100)."""
    names = _NAMES.get(gpu.key, ()) if gpu is not None else ()
    if not names:
        return ()
    return tuple(MigProfile(name, Fraction(sm, 7), Fraction(mem, 8), count)
                 for name, (sm, mem, count) in zip(names, _GEOMETRY, strict=True))


def find_profile(catalog_gpu: GPUModel | None, name: str) -> MigProfile | None:
    """The catalog's geometry of profile `name` on this GPU; None when the GPU has no such profile."""
    return next((p for p in profiles(catalog_gpu) if p.name == name), None)


def resource_name(gpu: GPUSpec) -> str:
    """The extended resource a pod of this pool requests: a MIG profile's, else whole GPUs."""
    return RESOURCE_PREFIX + gpu.mig.profile if gpu.mig is not None else WHOLE_GPU_RESOURCE


def devices_per_node(gpu: GPUSpec, catalog_gpu: GPUModel | None) -> int:
    """What a node of the pool offers pods: its slices of the profile, else its GPUs."""
    if gpu.mig is None:
        return gpu.per_node
    known = find_profile(catalog_gpu, gpu.mig.profile)
    per_gpu = gpu.mig.per_gpu or (known.max_per_gpu if known is not None else 1)
    return gpu.per_node * per_gpu


def resolve_slice(gpu: GPUSpec, catalog_gpu: GPUModel | None) -> MigSlice | str:
    """The slice of a MIG pool, or what is wrong with the pool's `gpu.mig`, naming the field."""
    mig = gpu.mig
    assert mig is not None
    known = find_profile(catalog_gpu, mig.profile)
    if known is None and (gpu.memory_mi_b is None or mig.compute_fraction is None):
        offered = ", ".join(p.name for p in profiles(catalog_gpu))
        product = catalog_gpu.key if catalog_gpu is not None else gpu.product
        where = f"{product}'s profiles are {offered}" if offered else f"{product} has no MIG profiles in the catalog"
        return (f"gpu.mig.profile {mig.profile!r} is not a MIG profile memfit knows of this GPU ({where}); "
                "name one of those, or set gpu.memoryMiB and gpu.mig.computeFraction for it")
    per_gpu = mig.per_gpu or (known.max_per_gpu if known is not None else 1)
    if known is not None and per_gpu > known.max_per_gpu:
        return (f"gpu.mig.perGPU is {per_gpu}, but a GPU holds at most {known.max_per_gpu} "
                f"{mig.profile} instances")
    whole_mib = catalog_gpu.usable_mib if catalog_gpu is not None else None
    memory_fraction = float(mig.memory_fraction if mig.memory_fraction is not None
                            else known.memory_fraction if known is not None else Fraction(1, per_gpu))
    if gpu.memory_mi_b is not None:
        usable = gpu.memory_mi_b
        if whole_mib is not None and usable > whole_mib:
            return (f"gpu.memoryMiB is {usable} for a {mig.profile} slice, more than the whole "
                    f"{catalog_gpu.key if catalog_gpu else gpu.product}'s {whole_mib} MiB")
    else:
        assert whole_mib is not None  # a known profile implies a catalog GPU
        usable = int(whole_mib * memory_fraction)
    compute = float(mig.compute_fraction if mig.compute_fraction is not None
                    else known.compute_fraction if known is not None else 1)
    if compute * per_gpu > 1 + 1e-9:
        return (f"gpu.mig.computeFraction {compute:g} x perGPU {per_gpu} is more than one GPU's compute")
    return MigSlice(mig.profile, RESOURCE_PREFIX + mig.profile, per_gpu, usable, compute, memory_fraction)

"""Built-in GPU catalog: usable memory, throughput, bandwidth and approximate on-demand price per GPU.

Usable MiB is what nvidia-smi reports as total with ECC on (modal-labs/modal-client PR #2797; H200 read
off an H200). Dense TFLOPS are NVIDIA datasheet figures without sparsity. Prices are approximate
on-demand $/GPU-hour with their source and date (shared/reference/memory-model.md §8): real prices
vary by region and change; every field can be overridden per GPUNodePool.
Host RAM and NVMe per GPU are those of the typical AWS instance family named in `instance`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

# Interruptions per node-hour assumed for a pool by its capacityType when the pool does not say
# (GPUNodePool spec.interruptionRatePerHour). On-demand and reserved nodes are not reclaimed. Spot: one
# per 20 node-hours, a deliberately cautious middle for GPU spot capacity, which clouds reclaim far more
# often than CPU capacity (AWS's Spot Instance Advisor puts most GPU instance types in its highest
# interruption band, >20% a month; SkyPilot's and "Can't Be Late" (NSDI 2024) traces show GPU spot
# lifetimes of hours in busy regions). Measure yours and set it per pool.
DEFAULT_INTERRUPTION_RATE_PER_HOUR: dict[str, float] = {"on-demand": 0.0, "reserved": 0.0, "spot": 0.05}


@dataclass(frozen=True, slots=True)
class GPUModel:
    """One GPU SKU."""

    key: str
    product: str  # nvidia.com/gpu.product as GPU Feature Discovery writes it
    usable_mib: int
    bf16_tflops: float  # dense tensor-core bf16 (0 = no bf16 support)
    fp16_tflops: float  # dense tensor-core fp16
    fp32_tflops: float  # CUDA-core fp32 (PyTorch disables TF32 for matmul by default)
    hbm_gbps: float
    price_per_gpu_hour: float
    price_source: str
    intra_node: str  # nvlink | pcie
    host_memory_gib_per_gpu: int
    nvme_gib_per_gpu: int
    instance: str
    aliases: tuple[str, ...] = ()

    @property
    def supports_bf16(self) -> bool:
        """bf16 needs compute capability >= 8.0 (Ampere)."""
        return self.bf16_tflops > 0

    @property
    def usable_bytes(self) -> int:
        return self.usable_mib * 1024 * 1024


BUILTIN_GPUS: tuple[GPUModel, ...] = (
    GPUModel(
        "t4",
        "Tesla-T4",
        15360,
        0.0,
        65.0,
        8.1,
        320,
        0.526,
        "approx. AWS g4dn.xlarge on-demand, 2026",
        "pcie",
        16,
        125,
        "g4dn",
        ("NVIDIA-T4", "Tesla-T4-SHARED"),
    ),
    GPUModel(
        "l4",
        "NVIDIA-L4",
        23034,
        121.0,
        121.0,
        30.3,
        300,
        0.805,
        "approx. AWS g6.xlarge on-demand, 2026",
        "pcie",
        16,
        250,
        "g6",
    ),
    GPUModel(
        "a10g",
        "NVIDIA-A10G",
        23028,
        70.0,
        70.0,
        31.2,
        600,
        1.006,
        "AWS g5.xlarge us-east-1, June 2026 (factualminds.com)",
        "pcie",
        16,
        250,
        "g5",
    ),
    GPUModel(
        "l40s",
        "NVIDIA-L40S",
        46068,
        362.0,
        362.0,
        91.6,
        864,
        1.861,
        "approx. AWS g6e.xlarge on-demand, 2026 (lantern-works/gpu-cloud-prices)",
        "pcie",
        32,
        250,
        "g6e",
    ),
    GPUModel(
        "a100-40",
        "NVIDIA-A100-SXM4-40GB",
        40960,
        312.0,
        312.0,
        19.5,
        1555,
        2.745,
        "AWS p4d.24xlarge $21.96/8, 2026 (datareceipts)",
        "nvlink",
        144,
        1000,
        "p4d",
        ("A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
    ),
    GPUModel(
        "a100-80",
        "NVIDIA-A100-SXM4-80GB",
        81920,
        312.0,
        312.0,
        19.5,
        2039,
        3.43,
        "AWS p4de on-demand, 2026 (datareceipts)",
        "nvlink",
        144,
        1000,
        "p4de",
        ("A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
    ),
    GPUModel(
        "h100-80",
        "NVIDIA-H100-80GB-HBM3",
        81559,
        989.0,
        989.0,
        67.0,
        3350,
        6.88,
        "AWS p5.48xlarge $55.04/8, 2026 (datareceipts)",
        "nvlink",
        256,
        3800,
        "p5",
        ("NVIDIA-H100-SXM5-80GB", "H100-80GB-HBM3"),
    ),
    GPUModel(
        "h200",
        "NVIDIA-H200",
        143771,
        989.0,
        989.0,
        67.0,
        4800,
        5.41,
        "AWS p5e Capacity Blocks (older snapshot); market 2.50-7.00",
        "nvlink",
        256,
        3800,
        "p5e",
        ("NVIDIA-H200-141GB-HBM3e",),
    ),
)



@dataclass(frozen=True, slots=True)
class GpuCatalog:
    """A set of GPU models, looked up by catalog key or GFD product label. The planner is handed one
    (the operator and the CLI pass `CATALOG`); tests can pass their own."""

    gpus: tuple[GPUModel, ...]
    # Interruptions per node-hour by capacityType, for a pool that does not set its own.
    interruption_rate_per_hour: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_INTERRUPTION_RATE_PER_HOUR), compare=False, hash=False)
    _by_name: dict[str, GPUModel] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        by_name = {name.lower(): g for g in self.gpus for name in (g.product, *g.aliases)}
        by_name.update({g.key: g for g in self.gpus})  # a key wins over another GPU's product label
        object.__setattr__(self, "_by_name", by_name)

    def __iter__(self) -> Iterator[GPUModel]:
        return iter(self.gpus)

    def __len__(self) -> int:
        return len(self.gpus)

    def find(self, name: str) -> GPUModel | None:
        """A GPU by catalog key (`l4`) or GFD product label (`NVIDIA-L4`), case-insensitive."""
        return self._by_name.get(name.strip().lower())

    def interruption_rate(self, capacity_type: str) -> float:
        """Default interruptions per node-hour of a capacity type (0 for one not listed)."""
        return self.interruption_rate_per_hour.get(capacity_type, 0.0)

    def keys(self) -> list[str]:
        """Catalog keys, cheapest first."""
        return [g.key for g in sorted(self.gpus, key=lambda g: (g.price_per_gpu_hour, g.key))]


CATALOG = GpuCatalog(BUILTIN_GPUS)


def find_gpu(name: str) -> GPUModel | None:
    """Look up a GPU of the built-in catalog by key (`l4`) or GFD product label (`NVIDIA-L4`)."""
    return CATALOG.find(name)

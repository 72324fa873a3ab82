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
    """One GPU SKU: memory, datasheet rates (dense, no sparsity), links, price and the host it comes in."""

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
    tf32_tflops: float = 0.0  # dense tensor-core TF32 (0 = none: Volta, Turing)
    sm_count: int = 108
    # Large-GEMM bf16/fp16 throughput reached / datasheet peak (MAMF; roofline docstring).
    matmul_efficiency: float = 0.80
    nvlink_gbps: float = 0.0  # GB/s per GPU and direction over NVLink (0 = none)
    pcie_gbps: float = 25.0  # GB/s per GPU and direction to the host, achievable
    network_gbits_per_node: float = 100.0  # the instance's network
    architecture: str = "ampere"  # volta | turing | ampere | ada | hopper | blackwell (kernels, timing.roofline)

    @property
    def supports_bf16(self) -> bool:
        """bf16 needs compute capability >= 8.0 (Ampere)."""
        return self.bf16_tflops > 0

    @property
    def flash_attention(self) -> bool:
        """FlashAttention-2 kernels need compute capability >= 8.0 (the same GPUs as bf16)."""
        return self.bf16_tflops > 0

    @property
    def usable_bytes(self) -> int:
        return self.usable_mib * 1024 * 1024


# Sources of the rates below (dense, without sparsity): the NVIDIA datasheets of V100 (SXM2), T4, A10
# (A10G: AWS's figures), L4, L40S, A100 (SXM4), H100 (SXM5 and PCIe), H200 and HGX B200. PCIe achievable
# per direction: Gen3 x16 12, Gen4 x16 25, Gen5 x16 50 GB/s (about 80 % of the raw rate). NVLink per GPU
# and direction: V100 NVLink2 150, A100 NVLink3 300, H100/H200 NVLink4 450, B200 NVLink5 900 GB/s.
# Matmul efficiency: the MAMF table (timing.roofline): A100 SXM 0.859, H100/H200 SXM 0.801, B200 0.776;
# GPUs not in that table get 0.80, the middle of its NVIDIA rows. Networks: the instance's documented
# bandwidth per node (AWS instance type pages).
BUILTIN_GPUS: tuple[GPUModel, ...] = (
    GPUModel("t4", "Tesla-T4", 15360, 0.0, 65.0, 8.1, 320, 0.526,
             "approx. AWS g4dn.xlarge on-demand, 2026", "pcie", 16, 125, "g4dn",
             ("NVIDIA-T4", "Tesla-T4-SHARED"), sm_count=40, pcie_gbps=12.0, network_gbits_per_node=100.0, architecture="turing"),
    GPUModel("l4", "NVIDIA-L4", 23034, 121.0, 121.0, 30.3, 300, 0.805,
             "approx. AWS g6.xlarge on-demand, 2026", "pcie", 16, 250, "g6",
             tf32_tflops=60.0, sm_count=58, network_gbits_per_node=100.0, architecture="ada"),
    GPUModel("a10g", "NVIDIA-A10G", 23028, 70.0, 70.0, 31.2, 600, 1.006,
             "AWS g5.xlarge us-east-1, June 2026 (factualminds.com)", "pcie", 16, 250, "g5",
             tf32_tflops=35.0, sm_count=80, network_gbits_per_node=100.0, architecture="ampere"),
    GPUModel("v100-16", "Tesla-V100-SXM2-16GB", 16160, 0.0, 125.0, 15.7, 900, 3.06,
             "AWS p3.16xlarge $24.48/8 on-demand, us-east-1 (AWS EC2 pricing page, 2025)", "nvlink", 61, 0, "p3",
             ("NVIDIA-V100-SXM2-16GB",), sm_count=80, nvlink_gbps=150.0, pcie_gbps=12.0,
             network_gbits_per_node=25.0, architecture="volta"),
    GPUModel("v100-32", "Tesla-V100-SXM2-32GB", 32510, 0.0, 125.0, 15.7, 900, 3.90,
             "AWS p3dn.24xlarge $31.21/8 on-demand, us-east-1 (AWS EC2 pricing page, 2025)", "nvlink", 96, 225,
             "p3dn", ("NVIDIA-V100-SXM2-32GB",), sm_count=80, nvlink_gbps=150.0,
             pcie_gbps=12.0, network_gbits_per_node=100.0, architecture="volta"),
    GPUModel("l40s", "NVIDIA-L40S", 46068, 362.0, 362.0, 91.6, 864, 1.861,
             "approx. AWS g6e.xlarge on-demand, 2026 (lantern-works/gpu-cloud-prices)", "pcie", 32, 250, "g6e",
             tf32_tflops=183.0, sm_count=142, network_gbits_per_node=400.0, architecture="ada"),
    GPUModel("a100-40", "NVIDIA-A100-SXM4-40GB", 40960, 312.0, 312.0, 19.5, 1555, 2.745,
             "AWS p4d.24xlarge $21.96/8, 2026 (datareceipts)", "nvlink", 144, 1000, "p4d",
             ("A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"), tf32_tflops=156.0, sm_count=108, matmul_efficiency=0.859,
             nvlink_gbps=300.0, network_gbits_per_node=400.0, architecture="ampere"),
    GPUModel("a100-80", "NVIDIA-A100-SXM4-80GB", 81920, 312.0, 312.0, 19.5, 2039, 3.43,
             "AWS p4de on-demand, 2026 (datareceipts)", "nvlink", 144, 1000, "p4de",
             ("A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"), tf32_tflops=156.0, sm_count=108, matmul_efficiency=0.859,
             nvlink_gbps=300.0, network_gbits_per_node=400.0, architecture="ampere"),
    GPUModel("h100-pcie", "NVIDIA-H100-PCIe", 81559, 756.0, 756.0, 51.0, 2000, 2.49,
             "approx. Lambda on-demand 1x H100 PCIe, 2025 (Lambda pricing page)", "pcie", 200, 1000,
             "lambda gpu_1x_h100_pcie", ("H100-PCIe", "NVIDIA-H100-PCIE-80GB"), tf32_tflops=378.0, sm_count=114,
             pcie_gbps=50.0, network_gbits_per_node=100.0, architecture="hopper"),
    GPUModel("h100-80", "NVIDIA-H100-80GB-HBM3", 81559, 989.0, 989.0, 67.0, 3350, 6.88,
             "AWS p5.48xlarge $55.04/8, 2026 (datareceipts)", "nvlink", 256, 3800, "p5",
             ("NVIDIA-H100-SXM5-80GB", "H100-80GB-HBM3"), tf32_tflops=494.5, sm_count=132, matmul_efficiency=0.801,
             nvlink_gbps=450.0, pcie_gbps=50.0, network_gbits_per_node=3200.0, architecture="hopper"),
    GPUModel("h200", "NVIDIA-H200", 143771, 989.0, 989.0, 67.0, 4800, 5.41,
             "AWS p5e Capacity Blocks (older snapshot); market 2.50-7.00", "nvlink", 256, 3800, "p5e",
             ("NVIDIA-H200-141GB-HBM3e",), tf32_tflops=494.5, sm_count=132, matmul_efficiency=0.801,
             nvlink_gbps=450.0, pcie_gbps=50.0, network_gbits_per_node=3200.0, architecture="hopper"),
    GPUModel("b200", "NVIDIA-B200", 183359, 2250.0, 2250.0, 75.0, 8000, 14.24,
             "approx. AWS p6-b200.48xlarge $113.93/8 on-demand, us-east-1, 2025 (AWS EC2 pricing page)", "nvlink",
             256, 3800, "p6-b200", ("B200",), tf32_tflops=1100.0, sm_count=148, matmul_efficiency=0.776,
             nvlink_gbps=900.0, pcie_gbps=50.0, network_gbits_per_node=3200.0, architecture="blackwell"),
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

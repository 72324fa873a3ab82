"""GPUNodePool: a set of identical GPU nodes with a price, as memfit's planner sees them."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from memfit.api.common import LIST_MAX, ApiModel, Condition, Toleration
from memfit.api.job import ObjectMeta


class CapacityType(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"


class IntraNode(StrEnum):
    NVLINK = "nvlink"
    PCIE = "pcie"


MIG_PROFILE = r"^[1-7]g\.[0-9]{1,4}gb(\+me)?$"


class MigSpec(ApiModel):
    """The pool's GPUs are MIG-partitioned: its pods get slices of one profile (memfit.mig)."""

    profile: str = Field(
        min_length=5, max_length=16, pattern=MIG_PROFILE,
        description="MIG profile of the slices (1g.10gb, 3g.40gb...): the pods request the device plugin's "
        "nvidia.com/mig-<profile> (mixed strategy). A pool has one profile; another profile on the same "
        "nodes is another pool.",
    )
    per_gpu: int | None = Field(
        default=None, ge=1, le=7, alias="perGPU",
        description="Slices of this profile per GPU; default the most the profile allows (1g.10gb: 7).",
    )
    compute_fraction: float | None = Field(
        default=None, gt=0, le=1,
        description="Share of the GPU's SMs in one slice; default from the profile (1g: 1/7, 3g: 3/7).",
    )
    memory_fraction: float | None = Field(
        default=None, gt=0, le=1,
        description="Share of the GPU's memory (and its bandwidth) in one slice; default from the profile "
        "(1g.10gb on an 80 GB GPU: 1/8).",
    )


    @model_validator(mode="after")
    def _fits_one_gpu(self) -> MigSpec:
        for message in mig_problems(self.profile, self.per_gpu, self.compute_fraction):
            raise ValueError(message)
        return self


# A GPU has seven compute slices; the digit before `g` is a profile's (NVIDIA MIG User Guide).
MIG_SLICES_MESSAGE = "gpu.mig.perGPU x the profile's compute slices (the digit before g) must be at most 7"
MIG_COMPUTE_MESSAGE = "gpu.mig.computeFraction x gpu.mig.perGPU must be at most 1 (one GPU's compute)"
MIG_CEL_RULES: list[dict[str, str]] = [
    {"rule": "!has(self.perGPU) || int(self.profile.substring(0, 1)) * self.perGPU <= 7",
     "message": MIG_SLICES_MESSAGE, "fieldPath": ".perGPU", "reason": "FieldValueInvalid"},
    {"rule": "!has(self.perGPU) || !has(self.computeFraction) || self.computeFraction * double(self.perGPU) <= 1.0",
     "message": MIG_COMPUTE_MESSAGE, "fieldPath": ".computeFraction", "reason": "FieldValueInvalid"},
]


def mig_problems(profile: str, per_gpu: int | None, compute_fraction: float | None) -> list[str]:
    """What the CRD's CEL rules refuse in a pool's gpu.mig, in the same words."""
    out: list[str] = []
    if per_gpu is not None and int(profile[0]) * per_gpu > 7:
        out.append(MIG_SLICES_MESSAGE)
    if per_gpu is not None and compute_fraction is not None and compute_fraction * per_gpu > 1.0:
        out.append(MIG_COMPUTE_MESSAGE)
    return out


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class DraSpec(ApiModel):
    """The pool's GPUs are requested through Dynamic Resource Allocation (resource.k8s.io/v1), not the
    device plugin's extended resource (memfit.kube.dra)."""

    device_class_name: str = Field(
        min_length=1, max_length=253, pattern=DNS_SUBDOMAIN,
        description="DeviceClass of the pool's devices (NVIDIA's DRA driver: gpu.nvidia.com for whole GPUs, "
        "mig.nvidia.com for MIG slices).",
    )
    driver: str = Field(
        default="gpu.nvidia.com", min_length=1, max_length=63, pattern=DNS_SUBDOMAIN,
        description="The DRA driver whose attributes and capacity the claims' selector reads "
        "(device.capacity[driver].memory, device.attributes[driver].profile).",
    )


class GPUSpec(ApiModel):
    """The GPUs of each node; unset fields come from the built-in catalog for a known product."""

    product: str = Field(
        min_length=1,
        max_length=128,
        description="GFD product label (NVIDIA-L4) or catalog key (l4); see `memfit catalog`.",
    )
    memory_mi_b: int | None = Field(
        default=None, ge=0, le=1_048_576, alias="memoryMiB", description="Usable MiB per GPU."
    )
    per_node: int = Field(default=1, ge=1, le=16, description="GPUs per node.")
    bf16_tflops: float | None = Field(
        default=None, ge=0, le=100_000, alias="bf16TFLOPS", description="Dense bf16 TFLOPS; 0 = no bf16."
    )
    memory_bandwidth_g_bps: float | None = Field(
        default=None, gt=0, le=100_000, alias="memoryBandwidthGBps",
        description="GPU memory bandwidth, GB/s (datasheet); default from the catalog for a known product.",
    )
    dra: DraSpec | None = Field(
        default=None,
        description="Request the GPUs through DRA ResourceClaims (a claim per pod: the plan's GPU count, a "
        "selector requiring the predicted peak plus headroom of device memory); unset: nvidia.com/gpu.",
    )
    mig: MigSpec | None = Field(
        default=None,
        description="MIG slices instead of whole GPUs; memoryMiB is then one slice's (GFD's "
        "nvidia.com/mig-<profile>.memory label), perNode still counts physical GPUs.",
    )


class HostSpec(ApiModel):
    """Host resources available to offload, and the node's write bandwidth to checkpoint storage."""

    memory_gi_b: int | None = Field(
        default=None, ge=0, le=65536, alias="memoryGiB", description="Host RAM per node."
    )
    nvme_gi_b: int | None = Field(
        default=None, ge=0, le=1_048_576, alias="nvmeGiB", description="Local NVMe per node."
    )
    checkpoint_write_g_bps: float | None = Field(
        default=None, gt=0, le=1000, alias="checkpointWriteGBps",
        description="GB/s (10^9 bytes/s, not Gbit/s) one node writes to the checkpoint volume. Unset = "
        "0.125, an AWS EBS gp3 volume's baseline 125 MiB/s rounded down; prices checkpoint writes.",
    )


class InterconnectSpec(ApiModel):
    """Bandwidth for collectives."""

    intra_node: IntraNode | None = Field(default=None, description="nvlink or pcie.")
    inter_node_gbps: float | None = Field(
        default=None, gt=0, le=100_000, description="Network Gbit/s per node."
    )


class GPUNodePoolSpec(ApiModel):
    """A pool of identical GPU nodes."""

    gpu: GPUSpec = Field(description="GPU model and count per node.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=16, description="Labels selecting the pool's nodes."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=LIST_MAX, description="Pod tolerations."
    )
    price_per_node_hour: float | None = Field(
        default=None, ge=0, le=100_000, description="$ per node-hour; default catalog price x GPUs."
    )
    capacity_type: CapacityType = Field(
        default=CapacityType.ON_DEMAND, description="on-demand, spot or reserved."
    )
    interruption_rate_per_hour: float | None = Field(
        default=None, ge=0, le=100,
        description="Expected interruptions per node-hour (spot reclaims); default by capacityType: "
        "spot 0.05, on-demand and reserved 0. Priced as lost work since the last checkpoint plus a restart.",
    )
    max_nodes: int = Field(default=8, ge=0, le=10_000, description="Most nodes the pool can provide.")
    host: HostSpec = Field(default_factory=HostSpec, description="Host RAM and NVMe per node.")
    interconnect: InterconnectSpec = Field(default_factory=InterconnectSpec, description="Links.")


class GPUNodePoolStatus(ApiModel):
    """Observed from matching Nodes and Pods."""

    nodes: int = Field(default=0, ge=0)
    ready_nodes: int = Field(default=0, ge=0)
    allocatable_gpus: int = Field(default=0, ge=0)
    free_gpus: int = Field(default=0, ge=0)
    conditions: list[Condition] = Field(default_factory=list, max_length=8)


class GPUNodePool(ApiModel):
    """The GPUNodePool resource as a whole."""

    api_version: Literal["memfit.dev/v1alpha1"] = Field(default="memfit.dev/v1alpha1", alias="apiVersion")
    kind: Literal["GPUNodePool"] = "GPUNodePool"
    metadata: ObjectMeta
    spec: GPUNodePoolSpec
    status: GPUNodePoolStatus | None = None

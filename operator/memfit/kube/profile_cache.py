"""The profile cache: one ConfigMap per problem and namespace, holding the Profile and measured peaks."""

from __future__ import annotations

import json
from dataclasses import dataclass

from memfit.api.profile import Profile
from memfit.api.termination import DEVICE_CPU
from memfit.kube.common import Manifest
from memfit.kube.names import (
    COMPONENT_PROFILE_CACHE,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_PROBLEM,
    MANAGED_BY,
    profile_cache_name,
)

MAX_OBSERVATIONS = 32  # newest kept; each is one finished or failed attempt


KIND_ALLOCATED = "allocated"  # allocator tensor bytes (CPU allocator or torch.cuda.max_memory_allocated)


@dataclass(frozen=True, slots=True)
class Observation:
    """What one finished or failed attempt measured: what auto-downsizing and OOM re-plans learn from.

    `measured_peak_bytes` is the largest rank's peak of kind `kind` (allocator tensor bytes) measured on
    `device` (`cpu`, or the GPU product); `rank_peaks` every rank's; `reserved_peak_bytes` the CUDA
    caching allocator's reservation (GPU only). Observations stored before these fields existed were
    CUDA allocator peaks on the plan's GPU and read as such."""

    config_key: str  # engine/stage/precision/checkpointing/offload/8bit/world/gpus-per-node/mbs/accumulation[/peft:rank:targets]
    gpu_product: str
    predicted_peak_bytes: int
    measured_peak_bytes: int
    gpu_memory_bytes: int
    out_of_memory: bool
    job: str
    kind: str = KIND_ALLOCATED
    device: str = ""  # "" = the plan's GPU product
    rank_peaks: tuple[int, ...] = ()
    reserved_peak_bytes: int | None = None
    device_peak_bytes: int | None = None  # NVML process bytes (GPU only, when the meter had NVML)
    step_seconds: float | None = None
    predicted_step_seconds: float | None = None  # the model's, before any learned factor
    predicted_compute_seconds: float | None = None  # its compute part (what a learned factor scales)

    @property
    def measured_on(self) -> str:
        return self.device or self.gpu_product

    @property
    def on_gpu(self) -> bool:
        return self.measured_on != DEVICE_CPU

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "configKey": self.config_key,
            "gpuProduct": self.gpu_product,
            "predictedPeakBytes": self.predicted_peak_bytes,
            "measuredPeakBytes": self.measured_peak_bytes,
            "gpuMemoryBytes": self.gpu_memory_bytes,
            "outOfMemory": self.out_of_memory,
            "job": self.job,
            "kind": self.kind,
            "rankPeaks": list(self.rank_peaks),
        }
        optional = {"device": self.device or None, "reservedPeakBytes": self.reserved_peak_bytes,
                    "devicePeakBytes": self.device_peak_bytes, "stepSeconds": self.step_seconds,
                    "predictedStepSeconds": self.predicted_step_seconds,
                    "predictedComputeSeconds": self.predicted_compute_seconds}
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Observation:
        reserved, nvml, step, predicted_step, predicted_compute = (raw.get(k) for k in (
            "reservedPeakBytes", "devicePeakBytes", "stepSeconds", "predictedStepSeconds", "predictedComputeSeconds"))
        ranks = raw.get("rankPeaks") or []
        return cls(
            config_key=str(raw["configKey"]),
            gpu_product=str(raw["gpuProduct"]),
            predicted_peak_bytes=int(str(raw["predictedPeakBytes"])),
            measured_peak_bytes=int(str(raw["measuredPeakBytes"])),
            gpu_memory_bytes=int(str(raw["gpuMemoryBytes"])),
            out_of_memory=bool(raw["outOfMemory"]),
            job=str(raw["job"]),
            kind=str(raw.get("kind", KIND_ALLOCATED)),
            device=str(raw.get("device", "")),
            rank_peaks=tuple(int(str(v)) for v in ranks) if isinstance(ranks, list) else (),
            reserved_peak_bytes=int(str(reserved)) if reserved is not None else None,
            device_peak_bytes=int(str(nvml)) if nvml is not None else None,
            step_seconds=float(str(step)) if step is not None else None,
            predicted_step_seconds=float(str(predicted_step)) if predicted_step is not None else None,
            predicted_compute_seconds=float(str(predicted_compute)) if predicted_compute is not None else None,
        )


@dataclass(frozen=True, slots=True)
class CachedProfile:
    profile: Profile
    observations: tuple[Observation, ...]


def build_profile_cache(*, namespace: str, problem_hash: str, cached: CachedProfile) -> Manifest:
    """ConfigMap `memfit-profile-<hash>`; not owned by a job, so it outlives them (auto-downsizing)."""
    observations = [o.to_dict() for o in cached.observations[-MAX_OBSERVATIONS:]]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": profile_cache_name(problem_hash),
            "namespace": namespace,
            "labels": {
                LABEL_COMPONENT: COMPONENT_PROFILE_CACHE,
                LABEL_PROBLEM: problem_hash[:16],
                LABEL_MANAGED_BY: MANAGED_BY,
            },
        },
        "data": {
            "profile.json": cached.profile.to_json(),
            "observations.json": json.dumps(observations, sort_keys=True),
        },
    }


def parse_profile_cache(data: dict[str, str] | None) -> CachedProfile | None:
    """Read a cache ConfigMap's data; None when absent or unreadable (then the job profiles again)."""
    if not data or "profile.json" not in data:
        return None
    try:
        profile = Profile.model_validate_json(data["profile.json"])
        raw = json.loads(data.get("observations.json", "[]"))
        observations = tuple(Observation.from_dict(o) for o in raw)
    except (ValueError, KeyError, TypeError):
        return None
    return CachedProfile(profile, observations)

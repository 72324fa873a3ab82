"""The profile cache: one ConfigMap per problem and namespace, holding the Profile and measured peaks."""

from __future__ import annotations

import json
from dataclasses import dataclass

from memfit.api.profile import Profile
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


@dataclass(frozen=True, slots=True)
class Observation:
    """A measured peak of one attempt: what auto-downsizing and OOM re-plans learn from."""

    config_key: str  # engine/stage/precision/checkpointing/offload/8bit/world/gpus/mbs/acc[/peft:rank:targets]
    gpu_product: str
    predicted_peak_bytes: int
    measured_peak_bytes: int
    gpu_memory_bytes: int
    out_of_memory: bool
    job: str

    def to_dict(self) -> dict[str, object]:
        return {
            "configKey": self.config_key,
            "gpuProduct": self.gpu_product,
            "predictedPeakBytes": self.predicted_peak_bytes,
            "measuredPeakBytes": self.measured_peak_bytes,
            "gpuMemoryBytes": self.gpu_memory_bytes,
            "outOfMemory": self.out_of_memory,
            "job": self.job,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Observation:
        return cls(
            config_key=str(raw["configKey"]),
            gpu_product=str(raw["gpuProduct"]),
            predicted_peak_bytes=int(str(raw["predictedPeakBytes"])),
            measured_peak_bytes=int(str(raw["measuredPeakBytes"])),
            gpu_memory_bytes=int(str(raw["gpuMemoryBytes"])),
            out_of_memory=bool(raw["outOfMemory"]),
            job=str(raw["job"]),
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

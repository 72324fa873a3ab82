"""Learning from an attempt: its measured peaks (per rank, with their kind and device) and step time go
to the profile cache, where later plans of the same problem read them (planner.measured)."""

from __future__ import annotations

from memfit.api.plan import Plan
from memfit.api.termination import (
    DEVICE_CPU,
    DEVICE_CUDA,
    KEY_DEVICE,
    KEY_DEVICE_PEAK_BYTES,
    KEY_MEMORY_METER,
    KEY_RANK_PEAKS,
    KEY_RESERVED_PEAK_BYTES,
    KEY_STEP_SECONDS,
)
from memfit.kube.profile_cache import (
    KIND_ALLOCATED,
    CachedProfile,
    Observation,
    build_profile_cache,
)
from memfit.lifecycle.draft import Draft
from memfit.lifecycle.observed import JobSummary
from memfit.lifecycle.planning import config_key
from memfit.lifecycle.result import WriteData
from memfit.lifecycle.snapshot import Snapshot

# Meters whose peak is allocator tensor bytes (memfit_trainer.meters): what the tensor terms learn from.
# `cpu-rss` (process RSS) counts the interpreter and libraries too and is reported, never learned.
# `simulated-gpu` is the CPU allocator with a simulated GPU's reservation and context on top (test bed).
ALLOCATOR_METERS = frozenset({"cuda-allocator", "cpu-allocator-profiler", "simulated-gpu"})



def learn(draft: Draft, snap: Snapshot, plan: Plan, digest: str, *, measured: int, oom: bool,
           job: JobSummary) -> None:
    """Store the attempt's measured peaks with the profile (auto-downsizing and OOM escalation)."""
    cached = snap.profile_cache
    if cached is None:
        return
    messages = [p.message for p in job.pods if p.message]
    ranks = max((_ints(m.get(KEY_RANK_PEAKS)) for m in messages), key=len, default=())
    reserved = max((int(v) for m in messages if isinstance(v := m.get(KEY_RESERVED_PEAK_BYTES), int)), default=0)
    nvml = max((int(v) for m in messages if isinstance(v := m.get(KEY_DEVICE_PEAK_BYTES), int)), default=0)
    steps = [float(v) for m in messages if isinstance(v := m.get(KEY_STEP_SECONDS), int | float)]
    devices = {str(m.get(KEY_DEVICE, "")) for m in messages}
    # A step time is a GPU's speed only when every rank ran on a real CUDA device: a CPU run, or the test
    # bed's simulated GPU (the CPU under a simulated memory budget), says nothing about a GPU's speed.
    real_gpu_speed = devices == {DEVICE_CUDA}
    on_cpu = any(str(m.get(KEY_DEVICE, "")) == DEVICE_CPU or str(m.get(KEY_MEMORY_METER, "")).startswith("cpu")
                 for m in messages)
    observation = Observation(
        config_key=config_key(plan),
        gpu_product=plan.gpu_product,
        predicted_peak_bytes=plan.memory.peak_bytes,
        measured_peak_bytes=measured,
        gpu_memory_bytes=plan.gpu_memory_bytes,
        out_of_memory=oom,
        job=f"{snap.job.name}/{plan.attempt}",
        kind=KIND_ALLOCATED,
        device=DEVICE_CPU if on_cpu else plan.gpu_product,
        rank_peaks=ranks,
        reserved_peak_bytes=reserved or None,
        device_peak_bytes=nvml or None,
        step_seconds=max(steps) if steps and (real_gpu_speed or on_cpu) else None,
        predicted_step_seconds=plan.model_step_seconds or plan.step_seconds,
        predicted_compute_seconds=plan.model_compute_seconds,
    )
    if any(o.job == observation.job for o in cached.observations):
        return
    updated = CachedProfile(cached.profile, (*cached.observations, observation))
    draft.effects.append(
        WriteData(
            build_profile_cache(namespace=snap.job.namespace, problem_hash=digest, cached=updated),
            exists=True,
        )
    )


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(int(v) for v in value if isinstance(v, int | float) and v >= 0)

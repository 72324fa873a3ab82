"""The read plan: what the reader (controller.read_snapshot) reads for a job, decided here from where
the job stands, so the reader only executes it (the needs_* rules of lifecycle.snapshot, combined)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memfit.api.job import MemoryOptimizedTrainingJobSpec, MemoryOptimizedTrainingJobStatus
from memfit.lifecycle.snapshot import (
    AttemptChildren,
    needs_profile_cache_to_learn,
    needs_quota_to_monitor,
    needs_world_to_monitor,
)
from memfit.lifecycle.world import World


@dataclass(frozen=True, slots=True)
class MonitorReads:
    """What a monitored attempt needs beyond its children."""

    pools: bool  # rebuild a deleted Job, compute a digest without a stored profile, or look for quota
    queue_quota: str  # the LocalQueue whose ClusterQueue quota to read ("" = none)
    profile_cache: bool  # learn a measured peak, or re-plan onto another pool's quota


def monitor_reads(
    children: AttemptChildren, status: MemoryOptimizedTrainingJobStatus, spec: MemoryOptimizedTrainingJobSpec,
    now: datetime,
) -> MonitorReads:
    quota = needs_quota_to_monitor(children.job, status, spec, now)
    return MonitorReads(
        pools=needs_world_to_monitor(children) or status.profile is None or quota,
        queue_quota=spec.scheduling.kueue_queue if quota else "",
        profile_cache=needs_profile_cache_to_learn(children.job) or quota,
    )


def needs_pools_for_digest(status: MemoryOptimizedTrainingJobStatus) -> bool:
    """A job not yet profiled keys its profile by the pools (lifecycle.profiling.profile_key)."""
    return status.profile is None


def needs_fresh_pools(spec: MemoryOptimizedTrainingJobSpec, world: World) -> bool:
    """The shared pool snapshot may predate a pool created a moment ago: the one `profiling.nodePool`
    names is missing from it."""
    return spec.profiling.node_pool != "auto" and world.pool(spec.profiling.node_pool) is None

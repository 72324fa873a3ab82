"""The operator's side of planning: live capacity and measured peaks in, Plan and status summary out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memfit import metrics
from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.api.training_config import TrainingConfig
from memfit.catalog import CATALOG
from memfit.controller.pools import PoolCapacity
from memfit.kube.names import NVME_MOUNT
from memfit.kube.profile_cache import Observation
from memfit.memory.strategy import Strategy
from memfit.planner import MeasuredPeak, PlanResult, plan, plan_summary


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A planner decision as the reconcile uses it."""

    plan: Plan | None
    summary: dict[str, Any]
    result: PlanResult

    def message(self) -> str:
        return self.result.message()


def config_key(p: Plan) -> str:
    """The configuration that ran, as stored with a measured peak (parsed back by `strategy_of`)."""
    return "/".join(
        str(x)
        for x in (
            p.engine.value,
            p.zero_stage,
            p.precision.value,
            p.activation_checkpointing.value,
            p.offload.value,
            int(p.optimizer8bit),
            p.nodes * p.gpus_per_node,
            p.gpus_per_node,
            p.micro_batch_size,
            p.gradient_accumulation_steps,
        )
    )


def strategy_of(key: str, spec: MemoryOptimizedTrainingJobSpec) -> Strategy | None:
    """Inverse of `config_key`; None for a key from another version."""
    parts = key.split("/")
    if len(parts) != 10:
        return None
    try:
        config = TrainingConfig(
            engine=Engine(parts[0]),
            zero_stage=int(parts[1]),
            precision=Precision(parts[2]),
            activation_checkpointing=Checkpointing(parts[3]),
            offload=Offload(parts[4]),
            optimizer8bit=parts[5] == "1",
            micro_batch_size=int(parts[8]),
            gradient_accumulation_steps=int(parts[9]),
        )
        return Strategy(config=config, optimizer=spec.training.optimizer, world_size=int(parts[6]),
                        gpus_per_node=int(parts[7]))
    except ValueError:
        return None


def measured_peaks(
    observations: Sequence[Observation], spec: MemoryOptimizedTrainingJobSpec
) -> list[MeasuredPeak]:
    """Observations as planner inputs; after an OOM the GPU's usable memory is a lower bound of the peak."""
    out: list[MeasuredPeak] = []
    for o in observations:
        strategy = strategy_of(o.config_key, spec)
        if strategy is None:
            continue
        peak = max(o.measured_peak_bytes, o.gpu_memory_bytes) if o.out_of_memory else o.measured_peak_bytes
        if peak > 0:
            out.append(MeasuredPeak(strategy=strategy, peak_bytes=peak))
    return out


def free_gpus(pools: Sequence[GPUNodePool], capacity: Mapping[str, PoolCapacity]) -> dict[str, int]:
    """GPUs a new attempt can get per pool: free now, plus nodes the pool may still add (autoscaling)."""
    out: dict[str, int] = {}
    for pool in pools:
        cap = capacity.get(pool.metadata.name)
        per_node = pool.spec.gpu.per_node
        if cap is None:
            out[pool.metadata.name] = pool.spec.max_nodes * per_node
            continue
        out[pool.metadata.name] = (
            cap.free_whole_nodes * per_node + max(0, pool.spec.max_nodes - cap.nodes) * per_node
        )
    return out


def plan_job(
    *,
    spec: MemoryOptimizedTrainingJobSpec,
    profile: Profile | None,
    pools: Sequence[GPUNodePool],
    capacity: Mapping[str, PoolCapacity],
    excluded_pools: frozenset[str],
    observations: Sequence[Observation],
    attempt: int,
    job_name: str,
    ignore_capacity: bool = False,
) -> PlanOutcome:
    """Plan attempt `attempt` of a job on the pools not excluded by earlier capacity failures.

    With `ignore_capacity` every pool counts as empty (up to maxNodes): whether the job could fit at
    all, which tells waiting for capacity apart from NoFit."""
    usable = [p for p in pools if p.metadata.name not in excluded_pools]
    with metrics.PLAN_SECONDS.time():
        result = plan(
            spec,
            pools=usable,
            catalog=CATALOG,
            profile=profile,
            measured_peaks=measured_peaks(observations, spec),
            free_gpus=None if ignore_capacity else free_gpus(usable, capacity),
        )
    if result.plan is None:
        if excluded_pools:
            result = _with_note(result, f"excluded after no capacity: {', '.join(sorted(excluded_pools))}")
        return PlanOutcome(None, {}, result)
    chosen = result.plan.model_copy(
        update={
            "attempt": attempt,
            # The folder goes to the pod as MEMFIT_CHECKPOINT_DIR (kube.train_job), where the runtime can
            # remap mounts; the plan leaves it unset so the env is what the trainer uses.
            "checkpoint_dir": None,
            "nvme_path": NVME_MOUNT if result.plan.offload == Offload.NVME else None,
        }
    )
    summary = plan_summary(result)
    return PlanOutcome(chosen, summary.to_wire() if summary else {}, result)


def plan_status(
    p: Plan, *, spec: MemoryOptimizedTrainingJobSpec, pools: Sequence[GPUNodePool]
) -> dict[str, Any]:
    """Status summary of a plan recovered from its ConfigMap (after an operator restart)."""
    gib = 2**30
    return {
        **p.training_config().to_wire(),
        "nodePool": p.node_pool,
        "nodes": p.nodes,
        "gpus": p.world_size,
        "gpuProduct": p.gpu_product,
        "predictedPeakBytes": p.memory.peak_bytes,
        "predictedPeak": f"{p.memory.peak_bytes / gib:.1f}Gi",
        "gpuMemoryBytes": p.gpu_memory_bytes,
        "costPerHour": round(p.price_per_hour, 4),
        "costPerHourText": f"${p.price_per_hour:.2f}",
        "estimatedHours": round(p.estimated_hours, 4),
        "estimatedCost": round(p.estimated_cost, 4),
    }


def _with_note(result: PlanResult, note: str) -> PlanResult:
    from dataclasses import replace

    return replace(result, reasons=(*result.reasons, note))

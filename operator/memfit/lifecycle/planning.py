"""The lifecycle's side of planning: live capacity and measured peaks in, Plan and status summary out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from memfit.api import pod as contract
from memfit.api.common import Checkpointing, Engine, Offload, OptimizerImplementation, PeftMethod, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec, PlanSummary
from memfit.api.peft import adapter_settings
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.api.training_config import TrainingConfig
from memfit.catalog import GpuCatalog
from memfit.kube.profile_cache import KIND_ALLOCATED, Observation
from memfit.lifecycle.quota import QueueQuota
from memfit.lifecycle.world import PoolCapacity
from memfit.memory.strategy import Strategy
from memfit.planner import MeasuredPeak, PlanResult, plan, plan_summary
from memfit.planner.measured import MeasuredDevice, PeakKind
from memfit.planner.measured_speed import MeasuredStepTime
from memfit.planner.memo import PlanMemo
from memfit.planner.offers import FreeGpus
from memfit.planner.plan_job import job_adapter

PLAN_MEMO: PlanMemo[PlanResult] = PlanMemo()


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A planner decision as the reconcile uses it."""

    plan: Plan | None
    summary: PlanSummary | None
    result: PlanResult

    def message(self) -> str:
        return self.result.message()


def config_key(p: Plan) -> str:
    """The configuration that ran, as stored with a measured peak (parsed back by `strategy_of`).

    A LoRA/QLoRA run adds an 11th part, `<method>:<rank>:<targets joined by +>`: its peak speaks only
    for the same adapters (the profile cache, and so its observations, is shared by every job of the
    problem), and must never be read as a full fine-tune's. The optimizer step in backward and the
    chunked loss follow the precision (`bf16~optim-in-bwd~chunked-loss`), and so does a chosen optimizer
    implementation (`bf16~impl-fused`), so keys stored before them parse as they were.
    """
    adapter = (p.adapter.rank, tuple(p.adapter.target_modules)) if p.adapter is not None else None
    return training_config_key(p, world_size=p.nodes * p.gpus_per_node, gpus_per_node=p.gpus_per_node,
                               adapter=adapter)


def training_config_key(p: TrainingConfig, *, world_size: int, gpus_per_node: int,
                        adapter: tuple[int, Sequence[str]] | None = None) -> str:
    """`config_key` of a configuration run on `world_size` ranks (the probe's: one), `adapter` its LoRA
    rank and targets."""
    techniques = [tag for tag, on in ((_IN_BACKWARD, p.optimizer_in_backward), (_CHUNKED, p.chunked_loss),
                                      (_ACT_OFFLOAD, p.activation_offload)) if on]
    if p.optimizer_implementation is not None:
        techniques.append(_IMPLEMENTATION + p.optimizer_implementation.value)
    parts = [
        str(x)
        for x in (
            p.engine.value,
            p.zero_stage,
            "~".join([p.precision.value, *techniques]),
            p.activation_checkpointing.value,
            p.offload.value,
            int(p.optimizer8bit),
            world_size,
            gpus_per_node,
            p.micro_batch_size,
            p.gradient_accumulation_steps,
        )
    ]
    if p.peft != PeftMethod.NONE and adapter is not None:
        parts.append(_adapter_tag(p.peft, adapter[0], adapter[1]))
    return "/".join(parts)


_IN_BACKWARD, _CHUNKED, _IMPLEMENTATION = "optim-in-bwd", "chunked-loss", "impl-"
_ACT_OFFLOAD = "act-offload"


def _adapter_tag(method: PeftMethod, rank: int, targets: Sequence[str]) -> str:
    return f"{method.value}:{rank}:{'+'.join(sorted(targets))}"


def strategy_of(key: str, spec: MemoryOptimizedTrainingJobSpec) -> Strategy | None:
    """Inverse of `config_key`; None for a key from another version, or a LoRA/QLoRA run whose
    adapters differ from this job's."""
    parts = key.split("/")
    if len(parts) not in (10, 11):
        return None
    peft, adapter = PeftMethod.NONE, None
    if len(parts) == 11:
        method = parts[10].split(":")[0]
        if method not in (PeftMethod.LORA.value, PeftMethod.QLORA.value):
            return None
        peft = PeftMethod(method)
        settings = adapter_settings(spec.problem.to_wire(), spec.strategy.peft)
        if settings is None or parts[10] != _adapter_tag(peft, settings.rank, settings.target_modules):
            return None
        adapter = job_adapter(spec)
        if adapter is None:
            return None
    precision, *techniques = parts[2].split("~")
    implementations = [t.removeprefix(_IMPLEMENTATION) for t in techniques if t.startswith(_IMPLEMENTATION)]
    try:
        config = TrainingConfig(
            engine=Engine(parts[0]),
            zero_stage=int(parts[1]),
            precision=Precision(precision),
            optimizer_in_backward=_IN_BACKWARD in techniques,
            chunked_loss=_CHUNKED in techniques,
            activation_offload=_ACT_OFFLOAD in techniques,
            optimizer_implementation=OptimizerImplementation(implementations[0]) if implementations else None,
            activation_checkpointing=Checkpointing(parts[3]),
            offload=Offload(parts[4]),
            optimizer8bit=parts[5] == "1",
            micro_batch_size=int(parts[8]),
            gradient_accumulation_steps=int(parts[9]),
            peft=peft,
        )
        return Strategy(config=config, optimizer=spec.training.optimizer, world_size=int(parts[6]),
                        gpus_per_node=int(parts[7]), adapter=adapter)
    except ValueError:
        return None


def measured_peaks(
    observations: Sequence[Observation], spec: MemoryOptimizedTrainingJobSpec
) -> tuple[list[MeasuredPeak], list[MeasuredDevice]]:
    """Observations as planner inputs, each compared like for like (planner.measured):

    - an allocator peak (largest rank) teaches the tensor terms, whether measured on a CPU or a GPU;
    - a GPU run's reservation and NVML bytes teach that GPU product's allocator gap and context;
    - after an OOM the GPU's usable memory is a lower bound of the whole device peak, on every GPU."""
    peaks: list[MeasuredPeak] = []
    devices: list[MeasuredDevice] = []
    for o in observations:
        strategy = strategy_of(o.config_key, spec)
        if strategy is None:
            continue
        if o.out_of_memory:
            peak = max(o.measured_peak_bytes, o.gpu_memory_bytes)
            if peak > 0:
                peaks.append(MeasuredPeak(strategy, peak, PeakKind.DEVICE))
            continue
        allocated = max((*o.rank_peaks, o.measured_peak_bytes))
        if o.kind == KIND_ALLOCATED and allocated > 0:
            peaks.append(MeasuredPeak(strategy, allocated, PeakKind.ALLOCATED))
        if o.kind == KIND_ALLOCATED and o.on_gpu and o.reserved_peak_bytes and allocated > 0:
            devices.append(MeasuredDevice(o.measured_on, strategy.world_size, allocated, o.reserved_peak_bytes,
                                          o.device_peak_bytes))
    return peaks, devices


def measured_step_times(observations: Sequence[Observation]) -> list[MeasuredStepTime]:
    """Step times of attempts that ran on a GPU and reported them, with the step time their plan predicted
    and the precision and engine they ran with (an out-of-memory attempt's few steps are not a speed)."""
    out: list[MeasuredStepTime] = []
    for o in observations:
        if not (o.on_gpu and not o.out_of_memory and o.step_seconds and o.predicted_step_seconds):
            continue
        parts = o.config_key.split("/")
        if len(parts) < 3:
            continue
        try:
            engine, precision = Engine(parts[0]), Precision(parts[2])
        except ValueError:
            continue
        out.append(MeasuredStepTime(o.measured_on, o.step_seconds, o.predicted_step_seconds,
                                    precision=precision, engine=engine,
                                    predicted_compute_seconds=o.predicted_compute_seconds))
    return out


def free_gpus(pools: Sequence[GPUNodePool], capacity: Mapping[str, PoolCapacity]) -> dict[str, FreeGpus]:
    """What a new attempt can get per pool: whole free nodes plus the nodes the pool may still add
    (autoscaling), and the free GPUs of its partly used nodes (for a plan that needs part of a node)."""
    out: dict[str, FreeGpus] = {}
    for pool in pools:
        cap = capacity.get(pool.metadata.name)
        if cap is None:
            out[pool.metadata.name] = FreeGpus(whole_nodes=pool.spec.max_nodes)
            continue
        whole = cap.free_whole_nodes + max(0, pool.spec.max_nodes - cap.nodes)
        out[pool.metadata.name] = FreeGpus(whole_nodes=whole, on_shared_nodes=cap.free_gpus_on_shared_nodes)
    return out


def usable_room(free: Mapping[str, int | FreeGpus] | None, pools: Sequence[GPUNodePool],
                max_nodes: int) -> tuple[tuple[str, object], ...] | None:
    """The free room of each pool as far as a job of at most `max_nodes` nodes can tell it apart
    (planner.offers.Offer.layouts): whole nodes up to `max_nodes`, a shared node's free GPUs up to one
    less than a node, a GPU cap up to the job's largest layout. Equal rooms give equal plans, so a busy
    cluster's changing counts beyond what the job could use do not make it plan again."""
    if free is None:
        return None
    out: list[tuple[str, object]] = []
    for pool in pools:
        name, per_node = pool.metadata.name, pool.spec.gpu.per_node
        room = free.get(name)
        most_gpus = max_nodes * per_node
        if isinstance(room, FreeGpus):
            most_shared = room.most_on_a_shared_node
            cap = None if room.max_gpus is None else min(room.max_gpus, most_gpus)
            out.append((name, (min(room.whole_nodes, max_nodes), min(most_shared, max(1, per_node - 1)), cap)))
        else:
            out.append((name, None if room is None else min(room, most_gpus)))
    return tuple(out)


def _capped(room: int | FreeGpus, gpus: int) -> int | FreeGpus:
    """Live room on a pool, capped at `gpus` (the queue's free quota there)."""
    if isinstance(room, FreeGpus):
        cap = gpus if room.max_gpus is None else min(room.max_gpus, gpus)
        return replace(room, max_gpus=cap)
    return min(room, gpus)


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
    catalog: GpuCatalog,
    ignore_capacity: bool = False,
    quota: QueueQuota | None = None,
    unusable: Mapping[str, str] | None = None,
) -> PlanOutcome:
    """Plan attempt `attempt` of a job on the pools not excluded by earlier capacity failures.

    With `ignore_capacity` every pool counts as empty (up to maxNodes): whether the job could fit at
    all, which tells waiting for capacity apart from NoFit. With a Kueue `quota`, a pool also offers
    no more GPUs than the ClusterQueue can admit there now (its nominal quota with `ignore_capacity`):
    memfit does not plan onto a pool whose quota cannot hold the plan. `unusable` (pool -> why: World.
    unusable_pools) are left out, and say why when nothing fits."""
    unusable = unusable or {}
    usable = [p for p in pools if p.metadata.name not in excluded_pools and p.metadata.name not in unusable]
    free: Mapping[str, int | FreeGpus] | None = None if ignore_capacity else free_gpus(usable, capacity)
    if quota is not None and free is None:
        free = {p.metadata.name: quota.nominal(p.metadata.name) for p in usable}  # a cap in GPUs
    elif quota is not None and free is not None:
        free = {name: _capped(room, quota.free(name)) for name, room in free.items()}
    peaks, devices = measured_peaks(observations, spec)
    step_times = measured_step_times(observations)

    def run() -> PlanResult:
        return plan(
            spec,
            pools=usable,
            catalog=catalog,
            profile=profile,
            measured_peaks=peaks,
            measured_devices=devices,
            free_gpus=free,
            measured_step_times=step_times,
        )

    # Identical inputs give the identical result (planner.memo): the spec, profile, what the planner reads
    # of the observations (not which job made them), quota, exclusions and pools by value, and of the live
    # capacity only the room this job could use, so the next capacity snapshot plans again only where it
    # changed what the job can get.
    key = (
        spec.model_dump_json(warnings=False),
        profile.model_dump_json() if profile is not None else None,
        repr((peaks, devices, step_times)),
        excluded_pools,
        ignore_capacity,
        repr(quota),
        tuple((p.metadata.name, p.spec.model_dump_json()) for p in usable),
        usable_room(free, usable, spec.placement.max_nodes),
    )
    result = PLAN_MEMO.get(key, (catalog,), run)
    if result.plan is None:
        if excluded_pools:
            note = f"excluded after no capacity: {', '.join(sorted(excluded_pools))}"
            result = replace(result, reasons=(*result.reasons, note))
        if quota is not None:
            result = replace(result, reasons=(*result.reasons, quota.describe()))
        if unusable:
            result = replace(result, reasons=(*result.reasons, *(unusable[k] for k in sorted(unusable))))
        return PlanOutcome(None, None, result)
    chosen = result.plan.model_copy(
        update={
            "attempt": attempt,
            # The folder goes to the pod as MEMFIT_CHECKPOINT_DIR (kube.train_job), where the runtime can
            # remap mounts; the plan leaves it unset so the env is what the trainer uses.
            "checkpoint_dir": None,
            "nvme_path": contract.NVME_MOUNT if result.plan.offload == Offload.NVME else None,
        }
    )
    return PlanOutcome(chosen, plan_summary(result), result)

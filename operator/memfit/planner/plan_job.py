"""`plan`: a job spec, its pools (and optionally a profile and measured peaks) -> PlanResult.

Pure and deterministic: no I/O, no clock, no randomness; the same inputs give the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from memfit.api.common import PeftMethod
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.peft import adapter_settings
from memfit.api.plan import BaselineCost, FullFinetuneComparison, Plan, round_cost
from memfit.api.pool import GPUNodePool
from memfit.api.problem import Task
from memfit.api.profile import ModelShape, Profile
from memfit.catalog import GpuCatalog
from memfit.memory.adapter import AdapterLayout, adapter_layout
from memfit.memory.calibration import Calibration, calibrate
from memfit.memory.problems import ShapeError, shape_from_problem
from memfit.memory.shape import Shape
from memfit.planner.baseline import plain_baseline, plain_config
from memfit.planner.context import SearchContext
from memfit.planner.cost_notes import NOTES_MAX, cost_notes
from memfit.planner.interruptions import NO_PERSISTENT_CHECKPOINT, CheckpointPolicy
from memfit.planner.measured import MeasuredDevice, MeasuredPeak, peak_corrections
from memfit.planner.measured_speed import (
    LearnedSpeed,
    MeasuredStepTime,
    SpeedKey,
    learned_speed_notes,
    step_time_factors,
    with_measured_speed,
)
from memfit.planner.memo import PlanMemo
from memfit.planner.offers import (
    FreeGpus,
    Offer,
    PoolRejection,
    catalog_pool,
    resolve_offer,
    resolve_offers,
    with_profile_refusals,
)
from memfit.planner.own_code import with_container_pins
from memfit.planner.practitioner import practitioner_baseline
from memfit.planner.result import BaselineResult, Candidate, PlanResult
from memfit.planner.search import any_fit, objective_key, prepare_offer, search_key, search_offer
from memfit.planner.space import Choice, pinned_fields, strategy_choices
from memfit.timing import time_terms

DEFAULT_ALTERNATIVES = 5
# A plan that rests on no measurement at all (Profile.compute `analytic`: the model could not be
# profiled, not even depth-reduced) adds this many percentage points to the job's memory headroom.
# The analytic model's worst under-prediction on the accuracy benchmark is 2.5 % (CPU truth), but
# such a plan has never met this model's kernels, the image's CUDA context or NCCL's buffers, each
# of which can be hundreds of MiB to GiBs (shared/reference/memory-model.md §5).
ANALYTIC_HEADROOM_PERCENT = 15


def resolve_shape(spec: MemoryOptimizedTrainingJobSpec, profile: Profile | None) -> ModelShape | str:
    """The model shape: the profile's when it has one, else derived from the problem; or why not."""
    if profile is not None and profile.shape is not None:
        return profile.shape
    if profile is not None and profile.error:
        return f"profiling failed: {profile.error}"
    try:
        return shape_from_problem(spec.problem)
    except ShapeError as error:
        return str(error)


def _no_fit(reasons: Sequence[str], rejections: Sequence[PoolRejection] = ()) -> PlanResult:
    return PlanResult(None, None, (), tuple(rejections), None, None, tuple(reasons))


def _baseline_offer(name: str, pools: Sequence[GPUNodePool], catalog: GpuCatalog) -> Offer | None:
    for pool in pools:
        if pool.metadata.name == name:
            resolved = resolve_offer(pool, catalog=catalog)
            return resolved if isinstance(resolved, Offer) else None
    gpu = catalog.find(name)
    if gpu is None:
        return None
    resolved = resolve_offer(catalog_pool(gpu), catalog=catalog)
    return resolved if isinstance(resolved, Offer) else None


def search_context(spec: MemoryOptimizedTrainingJobSpec, shape: ModelShape, *, profile: Profile | None = None,
                   measured_peaks: Sequence[MeasuredPeak] = (),
                   measured_devices: Sequence[MeasuredDevice] = (),
                   pools: Sequence[GPUNodePool] = ()) -> SearchContext:
    """The job's search context (calibrated from the profile's measurements when there are any; the
    checkpoint write bandwidth of `pools`)."""
    hot = Shape.of(shape)
    calibration: Calibration | None = None
    mfu: float | None = None
    flops = 0.0
    if profile is not None:
        if profile.measurements or profile.activation_curves:
            calibration = calibrate(profile, hot)  # with the optimizer the profile's steps ran
        if profile.mfu and profile.device.startswith("cuda"):
            mfu = profile.mfu
        flops = profile.flops_per_sample
    pinned_mbs = spec.strategy.micro_batch_size
    return SearchContext(
        adapter=job_adapter(spec),
        shape=hot,
        optimizer=spec.training.optimizer,
        global_batch=spec.training.global_batch_size,
        steps=spec.training.max_steps,
        headroom_percent=spec.objective.memory_headroom_percent + (
            ANALYTIC_HEADROOM_PERCENT if profile is not None and profile.compute == "analytic" else 0),
        minimize=spec.objective.minimize,
        max_cost_per_hour=spec.objective.max_cost_per_hour,
        deadline_hours=spec.objective.deadline_hours,
        max_nodes=spec.placement.max_nodes,
        pinned_micro_batch=pinned_mbs if isinstance(pinned_mbs, int) else None,
        calibration=calibration,
        corrections=peak_corrections(measured_peaks, hot, calibration=calibration, devices=measured_devices),
        flops_per_sample=flops,
        mfu=mfu,
        checkpoint=checkpoint_policy(spec),
        checkpoint_write_gbps={p.metadata.name: p.spec.host.checkpoint_write_g_bps for p in pools
                               if p.spec.host.checkpoint_write_g_bps is not None},
        pins=pinned_fields(spec.strategy),
    )


# Search contexts by the value of what they are built from: the memory and time terms, bounds and smallest
# peaks they cache depend on nothing else, so the next plan of the same job (another capacity snapshot,
# another job of a sweep) starts with them. The caches only ever gain entries that are true for the job.
CONTEXTS: PlanMemo[SearchContext] = PlanMemo(size=16)


def shared_search_context(spec: MemoryOptimizedTrainingJobSpec, shape: ModelShape, *,
                          profile: Profile | None = None, measured_peaks: Sequence[MeasuredPeak] = (),
                          measured_devices: Sequence[MeasuredDevice] = (),
                          pools: Sequence[GPUNodePool] = ()) -> SearchContext:
    """`search_context`, shared with earlier plans built from equal inputs."""
    key = (
        spec.model_dump_json(warnings=False),
        profile.model_dump_json() if profile is not None else None,
        repr(tuple(measured_peaks)),
        repr(tuple(measured_devices)),
        tuple(sorted((p.metadata.name, p.spec.host.checkpoint_write_g_bps) for p in pools
                     if p.spec.host.checkpoint_write_g_bps is not None)),
    )
    return CONTEXTS.get(key, (), lambda: search_context(
        spec, shape, profile=profile, measured_peaks=measured_peaks, measured_devices=measured_devices, pools=pools))


def checkpoint_policy(spec: MemoryOptimizedTrainingJobSpec) -> CheckpointPolicy:
    """Checkpoints that survive a lost node: on a claim (the user's, or the one the operator creates by
    default), every `everySteps` or at the interval memfit chooses when it is unset; with `emptyDir` they
    go with the pod and an interruption loses them."""
    checkpoint = spec.training.checkpoint
    if checkpoint.empty_dir:
        return NO_PERSISTENT_CHECKPOINT
    return CheckpointPolicy(persistent=True, every_steps=checkpoint.every_steps)


def job_adapter(spec: MemoryOptimizedTrainingJobSpec) -> AdapterLayout | None:
    """The LoRA/QLoRA layout of the job's adapter settings on its model (None when the job allows no
    PEFT, or the model's linear layers are not known analytically)."""
    if spec.strategy.peft.methods() == (PeftMethod.NONE,):
        return None
    wire = spec.problem.to_wire()
    settings = adapter_settings(wire, spec.strategy.peft)
    return adapter_layout(wire, settings) if settings is not None else None


def _peft_choices(ctx: SearchContext, choices: list[Choice], reasons: list[str]) -> list[Choice]:
    """Drop PEFT choices the memory model cannot describe (unknown linear layers), saying why."""
    if ctx.adapter is not None or all(c.config.peft == PeftMethod.NONE for c in choices):
        return choices
    reasons.append("LoRA/QLoRA: the model's linear layers are not known analytically (builtin, llama, "
                   "mistral, qwen2, qwen3, gpt2, bert, vit are); it is planned as a full fine-tune only")
    return [c for c in choices if c.config.peft == PeftMethod.NONE]


def build_plan(candidate: Candidate, spec: MemoryOptimizedTrainingJobSpec, *,
               calibration: Calibration | None = None, profile: Profile | None = None,
               offer: Offer | None = None, full_finetune: FullFinetuneComparison | None = None) -> Plan:
    """The Plan contract for a chosen candidate (with the source of each memory term); on an offer with
    measured device terms, the predicted peak with them and the GPU's physical usable memory. A LoRA/QLoRA
    plan carries its adapters, its trainable parameters and the full fine-tune it was compared with."""
    s = candidate.strategy
    memory = candidate.memory.to_breakdown()
    usable = candidate.usable_bytes
    if offer is not None and offer.device is not None and offer.physical_usable_bytes is not None:
        peak = math.ceil(memory.peak_bytes * offer.device.factor + offer.device.offset_bytes)
        memory = memory.model_copy(update={
            "peak_bytes": max(0, peak), "overhead_bytes": max(0, memory.overhead_bytes + peak - memory.peak_bytes)})
        usable = offer.physical_usable_bytes
    peft = s.config.peft != PeftMethod.NONE
    shape = resolve_shape(spec, profile)
    parameters = shape.parameters if not isinstance(shape, str) else None
    trainable = shape.trainable if not isinstance(shape, str) else None
    if peft and s.adapter is not None and not isinstance(shape, str):
        trainable = shape.layers * s.adapter.adapter_parameters_per_block
    sources = calibration.sources(s) if calibration is not None else dict.fromkeys(
        ("parameters", "optimizer", "activations", "step", "fragmentation"), "analytic")
    return Plan(
        **dict(s.config),
        nodes=candidate.nodes,
        gpus_per_node=s.gpus_per_node,
        node_pool=candidate.pool,
        gpu_product=candidate.product,
        gpu_memory_bytes=usable,
        memory=memory,
        headroom_percent=candidate.headroom_percent,
        price_per_hour=round_cost(candidate.price_per_hour),
        step_seconds=round_cost(candidate.step.step_seconds),
        estimated_hours=round_cost(candidate.hours),
        estimated_cost=round_cost(candidate.total_cost),
        problem=spec.problem,
        training=spec.training,
        data=spec.data,
        memory_sources=sources,
        find_unused_parameters=profile.unused_parameters if profile is not None else False,
        adapter=adapter_settings(spec.problem.to_wire(), spec.strategy.peft) if peft else None,
        parameters=parameters,
        trainable_parameters=trainable,
        full_finetune=full_finetune if peft else None,
    )


def plan(
    spec: MemoryOptimizedTrainingJobSpec,
    *,
    pools: Sequence[GPUNodePool],
    catalog: GpuCatalog,
    profile: Profile | None = None,
    measured_peaks: Sequence[MeasuredPeak] = (),
    measured_devices: Sequence[MeasuredDevice] = (),
    free_gpus: Mapping[str, int | FreeGpus] | None = None,
    measured_step_times: Sequence[MeasuredStepTime] = (),
    max_alternatives: int = DEFAULT_ALTERNATIVES,
) -> PlanResult:
    """Choose the configuration, pool and node count that minimise the job's objective.

    Returns a PlanResult: the Plan, up to `max_alternatives` alternatives (the best on each other
    pool), a rejection reason for every pool where nothing fits, and the practitioner's baseline
    (planner.practitioner) with the savings; or NoFit (plan None) with all reasons. Never raises on bad pools or impossible pins.
    `catalog` fills what a pool leaves unset (and stands in for a baseline pool that is not in `pools`);
    `free_gpus` (pool -> a GPU cap, or live free nodes and shared-node GPUs) limits the layouts;
    `measured_step_times` of finished GPU runs calibrate each product's throughput (planner.measured_speed); `measured_peaks` correct the predictions.
    """
    spec = with_container_pins(spec)  # a job's own script: the engine it runs (planner.own_code)
    shape = resolve_shape(spec, profile)
    if isinstance(shape, str):
        return _no_fit([shape])
    ctx = shared_search_context(spec, shape, profile=profile, measured_peaks=measured_peaks,
                                measured_devices=measured_devices, pools=pools)
    choices, pin_problems = strategy_choices(spec.strategy, lm_head=has_lm_head(spec, ctx.shape.vocab, ctx.shape.family),
                                             own_script=spec.container is not None)
    peft_reasons: list[str] = []
    choices = _peft_choices(ctx, choices, peft_reasons)
    if not choices:
        pin_problems = pin_problems or peft_reasons
    offers, rejections = resolve_offers(pools, catalog=catalog, allowed=spec.placement.node_pools,
                                        free_gpus=free_gpus, template=spec.pod_template)
    speed_factors = step_time_factors(measured_step_times)
    offers = [with_measured_speed(with_device_terms(with_profile_refusals(o, profile, catalog), ctx), speed_factors)
              for o in offers]
    baseline = _practitioner_default(ctx, spec, pools, catalog, speed_factors)
    declared = _declared_baseline(ctx, spec, pools, catalog, speed_factors)
    if not choices:
        return PlanResult(None, None, (), tuple(rejections), baseline, None, tuple(pin_problems),
                          declared_baseline=declared)
    best_per_pool = _best_per_pool(ctx, offers, choices, rejections, keep=1 + max_alternatives)
    rejections.sort(key=lambda r: r.pool)
    if not best_per_pool:
        reasons = [] if offers or rejections else ["no GPUNodePools to plan on"]
        return PlanResult(None, None, (), tuple(rejections), baseline, None, tuple(reasons),
                          declared_baseline=declared)
    ranked = sorted(best_per_pool, key=lambda c: (*objective_key(c, ctx.minimize), c.pool))
    chosen = ranked[0]
    savings = _savings(chosen, baseline)
    declared_savings = _savings(chosen, declared)
    device = next((o for o in offers if o.pool == chosen.pool), None)
    comparison = None
    if chosen.strategy.config.peft != PeftMethod.NONE:
        comparison = _full_finetune(ctx, spec, offers)
    chosen_plan = build_plan(chosen, spec, calibration=ctx.calibration, profile=profile,
                             offer=device, full_finetune=comparison).model_copy(update={
        "baseline": _recorded(baseline, savings), "declared_baseline": _recorded(declared, declared_savings),
        "cost_notes": _with_learned(list(cost_notes(ctx, chosen, ranked, offers)), learned_speed_notes(device)),
        "checkpoint_every_steps": ctx.candidate_checkpoints(chosen, device)[0] if device is not None else None,
        **_model_step(ctx, chosen, device),
    })
    notes = tuple(f"{o.pool}: {n}" for o in offers for n in o.notes) + tuple(peft_reasons)
    if ctx.calibration is not None:
        notes += ctx.calibration.notes
    return PlanResult(
        plan=chosen_plan,
        chosen=chosen,
        alternatives=tuple(ranked[1 : 1 + max_alternatives]),
        rejections=tuple(rejections),
        baseline=baseline,
        savings_percent=savings,
        notes=notes,
        declared_baseline=declared,
        declared_savings_percent=declared_savings,
    )


def _model_step(ctx: SearchContext, chosen: Candidate, offer: Offer | None) -> dict[str, float]:
    """The chosen step time before any learned factor, and its compute part (what the run's measured
    step time is compared with, so a learned factor never feeds back into the next one)."""
    if offer is None or not offer.speed.learned:
        return {"model_step_seconds": round_cost(chosen.step.step_seconds),
                "model_compute_seconds": round_cost(chosen.step.compute_seconds)}
    strategy = chosen.strategy
    terms = time_terms(ctx.shape, strategy, samples_per_gpu_step=ctx.samples_per_gpu(strategy.world_size),
                       flops_per_sample_override=ctx.flops_per_sample, mfu=ctx.mfu)
    model = terms.step_seconds(replace(offer.speed, learned=()), strategy.config.micro_batch_size)
    return {"model_step_seconds": round_cost(model.step_seconds), "model_compute_seconds": round_cost(model.compute_seconds)}


def _with_learned(notes: list[str], learned: list[str]) -> list[str]:
    """The cost notes with what the plan's GPU learned from measured step times, within the Plan's
    eight notes (the learned ones kept: they say why the step time differs from the model's)."""
    learned = learned[:NOTES_MAX // 2]
    return [*notes[: NOTES_MAX - len(learned)], *learned]


def has_lm_head(spec: MemoryOptimizedTrainingJobSpec, vocab: int, family: str = "decoder") -> bool:
    """Whether memfit_trainer can chunk this job's loss: a language-model head (vocabulary) on a model it
    builds itself (builtin, or a Hugging Face causal LM: not a masked-LM, classification or encoder-decoder
    task), not a user's entrypoint or container."""
    hf = spec.problem.huggingface
    causal = hf is None or hf.task_kind in (Task.AUTO, Task.CAUSAL_LM)
    return (vocab > 0 and causal and family != "encoder-decoder" and spec.problem.entrypoint is None
            and spec.container is None)


def _full_finetune(ctx: SearchContext, spec: MemoryOptimizedTrainingJobSpec,
                   offers: Sequence[Offer]) -> FullFinetuneComparison:
    """The best full fine-tune under the same pins on the same pools: what the plan is compared with
    (shown, never chosen: the job did not allow it, or it cost more)."""
    pins = spec.strategy.model_copy(update={"peft": spec.strategy.peft.model_copy(
        update={"method": PeftMethod.NONE, "allowed": []})})
    choices, problems = strategy_choices(pins, lm_head=has_lm_head(spec, ctx.shape.vocab, ctx.shape.family),
                                         own_script=spec.container is not None)
    if not choices:
        return FullFinetuneComparison(description=f"no full fine-tune under the pins: {'; '.join(problems)}"[:256])
    # Another list of choices: its ranks and memory ids mean other configurations than the plan's, so it
    # must not meet the caches the plan's search keyed by them.
    found = _best_per_pool(ctx.with_fresh_caches(), offers, choices, [], keep=1)
    if not found:
        return FullFinetuneComparison(description="a full fine-tune fits none of the pools")
    best = min(found, key=lambda c: (*objective_key(c, ctx.minimize), c.pool))
    return FullFinetuneComparison(peak_bytes=best.memory.peak_bytes, estimated_cost=round(best.total_cost, 6),
                                  description=best.describe()[:256])


def _best_per_pool(ctx: SearchContext, offers: Sequence[Offer], choices: Sequence[Choice],
                   rejections: list[PoolRejection], *, keep: int) -> list[Candidate]:
    """The best candidate of every pool that can enter the top `keep`, and a rejection for every
    pool where nothing fits. Pools are searched in order of their lower bound; once `keep` pools have
    a best, a later pool is only searched for candidates that can rank with the `keep`-th, and otherwise
    only checked for any fit (its exact best could not be shown)."""
    prepared = sorted((prepare_offer(ctx, o, choices) for o in offers), key=lambda p: (p.lowest_bound, p.offer.pool))
    found: list[Candidate] = []
    for item in prepared:
        cutoff = None
        if len(found) >= keep:
            kth = sorted(found, key=lambda c: (*objective_key(c, ctx.minimize), c.pool))[keep - 1]
            cutoff = search_key(kth, ctx.minimize)
        outcome = search_offer(ctx, item, cutoff=cutoff)
        if outcome.best is not None:
            found.append(outcome.best)
        elif cutoff is None or not any_fit(ctx, item):
            rejections.append(PoolRejection(item.offer.pool, item.failures.reason(
                headroom_percent=ctx.headroom_percent, global_batch=ctx.global_batch,
                pinned_micro_batch=ctx.pinned_micro_batch, max_cost_per_hour=ctx.max_cost_per_hour,
                deadline_hours=ctx.deadline_hours, pins=ctx.pins,
            )))
    return found


def with_device_terms(offer: Offer, ctx: SearchContext) -> Offer:
    """The offer with the memory budget its GPU product's measured device terms leave for an
    uncorrected prediction (peak x factor + offset fits usable iff peak fits the budget), so every
    bound and cache of the search stays valid. The physical usable memory stays in the Plan."""
    terms = ctx.corrections.device_terms(offer.product)
    if terms.factor == 1.0 and terms.offset_bytes == 0.0:
        return offer
    budget = terms.budget(offer.usable_bytes, headroom_percent=ctx.headroom_percent)
    note = (f"memory budget {budget / 2**30:.2f} GiB of {offer.usable_gib:.2f} GiB usable: measured on "
            f"{offer.product}, peaks x {terms.factor:.3f} {terms.offset_bytes / 2**20:+.0f} MiB "
            f"(allocator gap, CUDA context and NCCL, or an OOM)")
    return replace(offer, usable_bytes=max(0, budget), notes=(*offer.notes, note), device=terms,
                   physical_usable_bytes=offer.usable_bytes)


def _savings(chosen: Candidate, baseline: BaselineResult | None) -> float | None:
    """100 x (1 - plan cost / baseline cost); None without a baseline that has a cost."""
    if baseline is None or baseline.total_cost <= 0:
        return None
    return (1 - chosen.total_cost / baseline.total_cost) * 100


def _recorded(baseline: BaselineResult | None, savings: float | None) -> BaselineCost | None:
    if baseline is None or savings is None:
        return None
    return BaselineCost(label=baseline.label[:256], cost_per_hour=round_cost(baseline.price_per_hour),
                        cost=round_cost(baseline.total_cost), savings_percent=round(savings, 3),
                        hours=round_cost(baseline.hours))


def _practitioner_default(ctx: SearchContext, spec: MemoryOptimizedTrainingJobSpec, pools: Sequence[GPUNodePool],
                          catalog: GpuCatalog, speed_factors: Mapping[SpeedKey, LearnedSpeed]) -> BaselineResult | None:
    """The practitioner's setup under the job's pins on the allowed pools (capacity aside: it is what the
    job would have cost, not what is free now), with the same calibration and measured speeds as the plan."""
    offers, _ = resolve_offers(pools, catalog=catalog, allowed=spec.placement.node_pools,
                               template=spec.pod_template)
    return practitioner_baseline(ctx, [with_measured_speed(with_device_terms(o, ctx), speed_factors)
                                       for o in offers], pins=spec.strategy)


def _declared_baseline(ctx: SearchContext, spec: MemoryOptimizedTrainingJobSpec, pools: Sequence[GPUNodePool],
                       catalog: GpuCatalog, speed_factors: Mapping[SpeedKey, LearnedSpeed]) -> BaselineResult | None:
    """The plain setup on the pool and node count of `placement.baseline`, when the user named one."""
    placement = spec.placement.baseline
    if placement is None:
        return None
    offer = _baseline_offer(placement.node_pool, pools, catalog)
    if offer is None:
        return None
    offer = with_measured_speed(with_device_terms(offer, ctx), speed_factors)
    words = f"plain {plain_config(offer).precision.value} DDP"
    label = f"declared: {words} on {placement.nodes}x{offer.gpus_per_node} {offer.product} ({offer.pool})"
    return plain_baseline(ctx, offer, nodes=placement.nodes, label=label)

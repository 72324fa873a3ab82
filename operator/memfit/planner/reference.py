"""Exhaustive reference search: the planner's optimality is checked against it (tests, benchmark).

It enumerates every allowed PEFT method, engine, stage, precision, checkpointing, offload, optimizer width, layout and
micro-batch with only the public predictor (`predict_memory`, `estimate_step_seconds`) and the pool
resolution: no bounds, no closed forms, no caches. Slow by design; never used to plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TypeVar

from memfit.api.common import (
    Checkpointing,
    Engine,
    Offload,
    OptimizerImplementation,
    PeftMethod,
    Precision,
    Toggle,
)
from memfit.api.job import MemoryOptimizedTrainingJobSpec, Minimize
from memfit.api.pool import GPUNodePool
from memfit.api.training_config import TrainingConfig, optimizer_implementation_problem
from memfit.catalog import GpuCatalog
from memfit.memory import Strategy, predict_memory, strategy_problem
from memfit.planner.checkpoint_writes import write_seconds
from memfit.planner.offers import resolve_offers
from memfit.planner.plan_job import has_lm_head, resolve_shape, search_context
from memfit.planner.search import tier
from memfit.planner.space import offload_tried, precisions_allowed, strategy_choices, toggles
from memfit.timing import estimate_step_seconds

ENGINES = (Engine.DDP, Engine.FSDP, Engine.DEEPSPEED)
PRECISIONS = (Precision.BF16, Precision.FP16, Precision.FP32, Precision.BF16_PURE)
CHECKPOINTING = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.SELECTIVE_OP, Checkpointing.FULL)
OFFLOADS = (Offload.NONE, Offload.CPU, Offload.NVME)
T = TypeVar("T")


def _pinned(value: object, every: Sequence[T], auto: object) -> Sequence[T]:
    return every if value == auto else [v for v in every if v == value]


def _eight_bit(toggle: Toggle) -> tuple[bool, ...]:
    return (False, True) if toggle == Toggle.AUTO else (toggle == Toggle.ENABLED,)


def _micro_batches(per_gpu: int, pinned: object) -> Iterator[int]:
    for b in range(1, per_gpu + 1):
        if per_gpu % b == 0 and (pinned == "auto" or pinned == b):
            yield b


def _methods(spec: MemoryOptimizedTrainingJobSpec, known_layout: bool) -> tuple[PeftMethod, ...]:
    """The PEFT methods the job allows (only a full fine-tune when the adapters' layout is unknown)."""
    methods = spec.strategy.peft.methods()
    return methods if known_layout else tuple(m for m in methods if m == PeftMethod.NONE)


def _implementations(pin: OptimizerImplementation) -> tuple[OptimizerImplementation, ...]:
    """Every implementation a pin leaves: the planner takes fused for auto without searching; here each is
    tried, so the claim that fused is never worse is checked, not assumed."""
    if pin != OptimizerImplementation.AUTO:
        return (pin,)
    return (OptimizerImplementation.FUSED, OptimizerImplementation.FOREACH, OptimizerImplementation.FOR_LOOP)


def _implementation(impl: OptimizerImplementation | None, pin: OptimizerImplementation, precision: Precision,
                    offload: Offload, eight: bool) -> OptimizerImplementation | None:
    """`impl` where the optimizer lets it be chosen, else unset under auto (8-bit, bf16-pure, offload); a
    pin stays, for `strategy_problem` to refuse."""
    if impl is None:
        return None  # a job's own script: its library's default
    why = optimizer_implementation_problem(precision=precision, offload=offload, optimizer8bit=eight)
    return impl if why is None or pin != OptimizerImplementation.AUTO else None


def _preference(config: TrainingConfig) -> tuple[object, ...]:
    return (config.peft, config.engine, config.zero_stage, config.precision, config.activation_checkpointing,
            config.offload, config.optimizer8bit, config.optimizer_in_backward, config.chunked_loss,
            config.activation_offload)


def best_objective(spec: MemoryOptimizedTrainingJobSpec, pools: Sequence[GPUNodePool], *,
                   catalog: GpuCatalog) -> float | None:
    """The objective (total cost, or hours when minimizing time) of the best fitting configuration, or
    None when nothing fits. Best as the planner ranks (planner.search.objective_key): the lowest tie tier
    of the objective, then of the other one, fewer GPUs, the preference order (planner.space), a larger
    micro-batch, the exact objectives, the pool name."""
    shape = resolve_shape(spec, None)
    if isinstance(shape, str):
        return None
    lm_head = has_lm_head(spec, shape.vocab, shape.family)
    if spec.strategy.chunked_loss == Toggle.ENABLED and not lm_head:
        return None  # the planner refuses the pin (planner.space)
    own = spec.container is not None
    ranks = {_preference(c.config): c.rank
             for c in strategy_choices(spec.strategy, lm_head=lm_head, own_script=own)[0]}
    ctx = search_context(spec, shape, pools=pools)
    offers, _ = resolve_offers(pools, catalog=catalog, allowed=spec.placement.node_pools)
    pins, objective = spec.strategy, spec.objective
    headroom = objective.memory_headroom_percent
    g_batch = spec.training.global_batch_size
    stages = range(4) if pins.zero_stage == "auto" else (int(pins.zero_stage),)
    best: tuple[object, ...] | None = None
    for offer in offers:
        for layout in offer.layouts(spec.placement.max_nodes):
            n, g = layout.world_size, layout.gpus_per_node
            if g_batch % n or (objective.max_cost_per_hour is not None
                               and layout.price_per_hour > objective.max_cost_per_hour):
                continue
            per_gpu = g_batch // n
            for method, engine in itertools.product(_methods(spec, ctx.adapter is not None),
                                                    _pinned(pins.engine, ENGINES, Engine.AUTO)):
                for stage in stages:
                    for precision in precisions_allowed(pins.precision, allow_pure_bf16=pins.allow_pure_bf16):
                        if precision in (Precision.BF16, Precision.BF16_PURE) and not offer.supports_bf16:
                            continue
                        qlora_compute = pins.peft.qlora.compute_dtype
                        if method == PeftMethod.QLORA and qlora_compute not in (Precision.AUTO, precision):
                            continue
                        for ckpt in _pinned(pins.activation_checkpointing, CHECKPOINTING, Checkpointing.AUTO):
                            if own and ckpt == Checkpointing.SELECTIVE_OP and pins.activation_checkpointing == Checkpointing.AUTO:
                                continue  # a script is never asked for memfit's per-op policy (planner.space)
                            for offload in _pinned(pins.offload, OFFLOADS, Offload.AUTO):
                                if offload == Offload.CPU and offer.host_bytes_per_node is None:
                                    continue
                                for eight, in_bwd, chunked, act_off, impl, b in itertools.product(
                                        _eight_bit(pins.optimizer8bit), toggles(pins.optimizer_in_backward),
                                        toggles(pins.chunked_loss) if lm_head else (False,),
                                        (False,) if own else offload_tried(pins.activation_offload, ckpt),
                                        (None,) if own else _implementations(pins.optimizer_implementation),
                                        _micro_batches(per_gpu, pins.micro_batch_size)):
                                        config = TrainingConfig.model_construct(
                                            engine=engine, zero_stage=stage, precision=precision,
                                            activation_checkpointing=ckpt, offload=offload, optimizer8bit=eight,
                                            micro_batch_size=b, gradient_accumulation_steps=per_gpu // b,
                                            peft=method, optimizer_in_backward=in_bwd, chunked_loss=chunked,
                                            activation_offload=act_off,
                                            optimizer_implementation=_implementation(
                                                impl, pins.optimizer_implementation, precision, offload, eight))
                                        s = Strategy(config, spec.training.optimizer, n, g, adapter=ctx.adapter)
                                        if strategy_problem(s) is not None:
                                            continue
                                        m = predict_memory(ctx.shape, s)
                                        if m.peak_bytes * (1 + headroom / 100) > offer.usable_bytes:
                                            continue
                                        if act_off and offer.host_bytes_per_node is None:
                                            continue
                                        if (offload != Offload.NONE or act_off) and (
                                                m.host_bytes * g > offer.host_usable_bytes_per_node):
                                            continue
                                        if m.nvme_bytes * g > offer.nvme_bytes_per_node:
                                            continue
                                        seconds = estimate_step_seconds(ctx.shape, s, offer.speed).step_seconds
                                        writes = 0.0 if not ctx.checkpoint.persistent else write_seconds(
                                            ctx.checkpoint_bytes_per_node(s), write_gbps=ctx.write_gbps(offer.pool))
                                        hours = ctx.expected_hours(offer, layout, seconds, writes)
                                        if hours == float("inf"):
                                            continue
                                        if objective.deadline_hours is not None and hours > objective.deadline_hours:
                                            continue
                                        cost = hours * layout.price_per_hour
                                        first, second = (hours, cost) if objective.minimize == Minimize.TIME else (
                                            cost, hours)
                                        key = (tier(first), tier(second), n, ranks[_preference(config)], -b,
                                               first, second, offer.pool)
                                        best = key if best is None else min(best, key)
    return None if best is None else float(best[5])  # type: ignore[arg-type]

"""Baselines the savings are measured against, and the one evaluator they share.

- The default baseline is the practitioner's (planner.practitioner): a rule of thumb picks the GPU,
  then plain DDP escalates through checkpointing, bigger GPUs, FSDP and CPU offload until memfit's
  model says it fits. Every rung is priced here, by `setup_baseline`.
- `plain_baseline`: plain DDP with bf16 autocast (fp16 on GPUs without bf16), the job's optimizer in
  32 bits, no checkpointing, no offload, on whole nodes. `placement.baseline` (the declared baseline)
  runs it on the pool and node count the user named; `cheapest_plain_baseline` puts it on the pool
  where it is cheapest (the benchmark's "does a plain setup fit at all" test).
- `fp32_baseline`: the same in fp32 (the planner benchmark's history).
- `static_baseline`: a STRAWMAN kept for history and labelled so: (weights + gradients + optimizer)
  in fp32 x 1.2 picks the smallest GPU, run as fp32 DDP. No headline figure uses it.

Every baseline is predicted by the same memory and time model as memfit's plan (with the same
measured-peak corrections and interruption pricing), so the two costs compare like for like.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memfit.api.common import Offload, PeftMethod, Precision
from memfit.api.training_config import PLAIN_FP32_DDP, TrainingConfig
from memfit.memory.predict import MemoryTerms, memory_terms
from memfit.memory.states import optimizer_state_bytes_per_param
from memfit.memory.strategy import Strategy
from memfit.planner.checkpoint_writes import write_seconds
from memfit.planner.context import SearchContext
from memfit.planner.explain import gib
from memfit.planner.offers import Layout, Offer
from memfit.planner.result import BaselineResult
from memfit.planner.space import divisors
from memfit.timing.step import time_terms

# Static sizing margin of the strawman: "(weights + grads + Adam) x 1.2".
STATIC_MARGIN = 1.2
# Memory terms of one practitioner run, by (configuration without batch split, world size, GPUs per node).
TermsMemo = dict[tuple[object, ...], MemoryTerms]


def plain_config(offer: Offer) -> TrainingConfig:
    """DDP, bf16 autocast (fp16 where the GPU has no bf16), nothing else."""
    precision = Precision.BF16 if offer.supports_bf16 else Precision.FP16
    return PLAIN_FP32_DDP.model_copy(update={"precision": precision})


def plain_baseline(ctx: SearchContext, offer: Offer, *, nodes: int, label: str | None = None) -> BaselineResult:
    """The plain setup on `nodes` whole nodes of `offer` (see the module docstring)."""
    config = plain_config(offer)
    words = f"plain {config.precision.value} DDP"
    return _ddp_baseline(ctx, offer, config, nodes=nodes,
                         label=label or f"{words} on {nodes}x{offer.gpus_per_node} {offer.product} ({offer.pool})")


def cheapest_plain_baseline(ctx: SearchContext, offers: Sequence[Offer]) -> BaselineResult | None:
    """The plain setup on one whole node of the pool where it fits at the lowest total cost (ties: the
    pool name); None when it fits on no pool."""
    fitting = [b for b in (plain_baseline(ctx, o, nodes=1) for o in offers) if b.fits]
    if not fitting:
        return None
    return min(fitting, key=lambda b: (b.total_cost, b.pool))


def fp32_baseline(ctx: SearchContext, offer: Offer, *, nodes: int, label: str | None = None) -> BaselineResult:
    """fp32 DDP on `nodes` full nodes of `offer`."""
    return _ddp_baseline(ctx, offer, PLAIN_FP32_DDP, nodes=nodes,
                         label=label or f"fp32 DDP on {nodes}x{offer.gpus_per_node} {offer.product} ({offer.pool})")


def _ddp_baseline(ctx: SearchContext, offer: Offer, config: TrainingConfig, *, nodes: int,
                  label: str) -> BaselineResult:
    """`config` on `nodes` whole nodes, paid in full; as many of their GPUs as split the global batch."""
    requested = nodes * offer.gpus_per_node
    world = max(d for d in divisors(ctx.global_batch) if d <= requested)
    note = "" if world == requested else (
        f"uses {world} of {requested} GPUs: training.globalBatchSize {ctx.global_batch} is not divisible by {requested}"
    )
    return setup_baseline(ctx, offer, config, world_size=world, gpus_per_node=min(world, offer.gpus_per_node),
                          nodes=nodes, price_per_hour=nodes * offer.price_per_node_hour, label=label, note=note)


def setup_baseline(ctx: SearchContext, offer: Offer, config: TrainingConfig, *, world_size: int,
                   gpus_per_node: int, nodes: int, price_per_hour: float, label: str, note: str = "",
                   memo: TermsMemo | None = None) -> BaselineResult:
    """One setup a user would run, judged by memfit's model: the largest micro-batch whose predicted peak
    fits (`ctx.fits_gpu`, the plan's own rule), host RAM and NVMe for offload, the step time of
    `time_terms` and the expected hours with checkpoint writes and interruptions priced as for the plan. It always has a cost;
    `fits` and `note` say whether and why not. `memo` shares memory terms between rungs of one run.
    `nodes` and `price_per_hour` are what is rented (whole nodes, or a part of one priced pro rata)."""
    world, g = world_size, gpus_per_node
    strategy = Strategy(config=config, optimizer=ctx.optimizer, world_size=world, gpus_per_node=g,
                        adapter=ctx.adapter if config.peft != PeftMethod.NONE else None)
    terms = _terms(ctx, strategy, memo)
    per_gpu = ctx.samples_per_gpu(world)
    sizes = (ctx.pinned_micro_batch,) if ctx.pinned_micro_batch is not None else tuple(reversed(divisors(per_gpu)))
    micro = next((b for b in sizes if per_gpu % b == 0 and ctx.fits_gpu(terms.peak_bytes(b, per_gpu // b),
                                                                         offer.usable_bytes)), 0)
    problems = [note] if note else []
    fits = micro > 0
    if not fits:
        micro = sizes[-1] if per_gpu % sizes[-1] == 0 else 1
        need = terms.peak_bytes(micro, per_gpu // micro) * (1 + ctx.headroom_percent / 100)
        problems.append(f"does not fit: needs {gib(need)} per GPU at micro-batch {micro} (incl. "
                        f"{ctx.headroom_percent}% headroom); has {gib(offer.usable_bytes)}")
    host_problem = _host_problem(config, offer, host_bytes=terms.host_bytes * g, nvme_bytes=terms.nvme_bytes * g)
    if host_problem:
        fits = False
        problems.append(host_problem)
    tt = time_terms(ctx.shape, strategy, samples_per_gpu_step=per_gpu,
                    flops_per_sample_override=ctx.flops_per_sample, mfu=ctx.mfu)
    step = tt.step_seconds(offer.speed, micro)
    # Checkpoint writes and interruptions priced as for memfit's plan (the same pool, checkpoint policy
    # and model): both sides alike.
    writes = 0.0
    if ctx.checkpoint.persistent:
        writes = write_seconds(ctx.checkpoint_bytes_per_node(strategy), write_gbps=ctx.write_gbps(offer.pool))
    hours = ctx.expected_hours(offer, Layout(nodes, g, price_per_hour), step.step_seconds, writes)
    if math.isinf(hours):
        fits = False
        problems.append("would not finish: interruptions come faster than it checkpoints")
    accumulation = per_gpu // micro
    return BaselineResult(
        label=label,
        pool=offer.pool,
        product=offer.product,
        nodes=nodes,
        world_size=world,
        micro_batch_size=micro,
        fits=fits,
        peak_bytes=int(-(-terms.peak_bytes(micro, accumulation) // 1)),
        usable_bytes=offer.usable_bytes,
        price_per_hour=price_per_hour,
        step_seconds=step.step_seconds,
        hours=hours,
        total_cost=hours * price_per_hour,
        note="; ".join(problems),
        config=config.model_copy(update={"micro_batch_size": micro, "gradient_accumulation_steps": accumulation}),
    )


def _terms(ctx: SearchContext, strategy: Strategy, memo: TermsMemo | None) -> MemoryTerms:
    key = (strategy.config.key(), strategy.world_size, strategy.gpus_per_node)
    terms = memo.get(key) if memo is not None else None
    if terms is None:
        terms = memory_terms(ctx.shape, strategy, calibration=ctx.calibration)
        factor = ctx.corrections.factor(strategy)
        if factor != 1.0:
            terms = terms.scaled(factor)
        if memo is not None:
            memo[key] = terms
    return terms


def _host_problem(config: TrainingConfig, offer: Offer, *, host_bytes: float, nvme_bytes: float) -> str:
    """Why offload does not fit the node ('' when it does or there is none): the planner's host rules."""
    if config.offload == Offload.NONE:
        return ""
    if config.offload == Offload.CPU and offer.host_bytes_per_node is None:
        return "CPU offload: the pool does not say its host memory (host.memoryGiB)"
    if config.offload == Offload.CPU and host_bytes > offer.host_usable_bytes_per_node:
        return f"CPU offload needs {gib(host_bytes)} of host RAM per node; has {gib(offer.host_usable_bytes_per_node)}"
    if nvme_bytes > offer.nvme_bytes_per_node:
        return f"NVMe offload needs {gib(nvme_bytes)} per node; has {gib(offer.nvme_bytes_per_node)}"
    return ""


def static_bytes(ctx: SearchContext) -> float:
    """(fp32 weights + gradients + optimizer state) x 1.2 for the model (the strawman's rule)."""
    per_param = 4 + 4 + optimizer_state_bytes_per_param(ctx.optimizer, eight_bit=False)
    return per_param * ctx.shape.parameters * STATIC_MARGIN


def static_baseline(ctx: SearchContext, offers: Sequence[Offer], *, nodes: int = 1) -> BaselineResult | None:
    """STRAWMAN: fp32 DDP on the smallest GPU the static rule says fits (None when no GPU is big enough)."""
    need = static_bytes(ctx)
    big_enough = [o for o in offers if o.usable_bytes >= need]
    if not big_enough:
        return None
    offer = min(big_enough, key=lambda o: (o.usable_bytes, o.price_per_node_hour / o.gpus_per_node, o.pool))
    label = (f"strawman static {gib(need)} rule: fp32 DDP on {nodes}x{offer.gpus_per_node} {offer.product} "
             f"({offer.pool})")
    return fp32_baseline(ctx, offer, nodes=nodes, label=label)

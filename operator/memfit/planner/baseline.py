"""Baselines the savings are measured against.

- `fp32_baseline`: what the job would run without memfit: fp32 DDP, no checkpointing, no offload,
  32-bit optimizer, on the spec's baseline pool (placement.baseline, default a100-80) with its node
  count and all their GPUs (fewer if the global batch is not divisible), at the largest micro-batch
  memfit predicts to fit. It may not fit at all; its cost is then what it would cost if it ran.
- `static_baseline`: the common static sizing rule: (weights + gradients + optimizer state) in fp32
  x 1.2, on the smallest GPU whose memory holds that, run as fp32 DDP on the baseline's node count.
"""

from __future__ import annotations

from collections.abc import Sequence

from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.memory.predict import memory_terms
from memfit.memory.states import optimizer_state_bytes_per_param
from memfit.memory.timing import time_terms
from memfit.planner.context import SearchContext
from memfit.planner.explain import gib
from memfit.planner.offers import Offer
from memfit.planner.result import BaselineResult
from memfit.planner.space import Choice, divisors

DEFAULT_BASELINE_POOL = "a100-80"
# Static sizing margin: "(weights + grads + Adam) x 1.2" (the rule of thumb issue 4 compares against).
STATIC_MARGIN = 1.2
FP32_DDP = Choice(PLAIN_FP32_DDP, rank=-1)


def fp32_baseline(ctx: SearchContext, offer: Offer, *, nodes: int, label: str | None = None) -> BaselineResult:
    """fp32 DDP on `nodes` full nodes of `offer` (see the module docstring)."""
    requested = nodes * offer.gpus_per_node
    world = max(d for d in divisors(ctx.global_batch) if d <= requested)
    g = min(world, offer.gpus_per_node)
    note = "" if world == requested else (
        f"uses {world} of {requested} GPUs: training.globalBatchSize {ctx.global_batch} is not divisible by {requested}"
    )
    strategy = FP32_DDP.strategy(optimizer=ctx.optimizer, world_size=world, gpus_per_node=g)
    terms = memory_terms(ctx.shape, strategy, calibration=ctx.calibration)
    per_gpu = ctx.global_batch // world
    micro = 0
    for b in reversed(divisors(per_gpu)):
        peak = terms.peak_bytes(b, per_gpu // b)
        if ctx.fits_gpu(peak, offer.usable_bytes):
            micro = b
            break
    fits = micro > 0
    if not fits:
        micro = 1
        need = terms.peak_bytes(1, per_gpu) * (1 + ctx.headroom_percent / 100)
        note = "; ".join(filter(None, [note, (
            f"does not fit: needs {gib(need)} per GPU at micro-batch 1 (incl. {ctx.headroom_percent}% "
            f"headroom); has {gib(offer.usable_bytes)}"
        )]))
    tt = time_terms(ctx.shape, strategy, samples_per_gpu_step=per_gpu,
                    flops_per_sample_override=ctx.flops_per_sample, mfu=ctx.mfu)
    step = tt.step_seconds(offer.speed, micro)
    hours = ctx.steps * step.step_seconds / 3600
    price = nodes * offer.price_per_node_hour
    peak_bytes = int(-(-terms.peak_bytes(micro, per_gpu // micro) // 1))
    return BaselineResult(
        label=label or f"fp32 DDP on {nodes}x{offer.gpus_per_node} {offer.product} ({offer.pool})",
        pool=offer.pool,
        product=offer.product,
        nodes=nodes,
        world_size=world,
        micro_batch_size=micro,
        fits=fits,
        peak_bytes=peak_bytes,
        usable_bytes=offer.usable_bytes,
        price_per_hour=price,
        step_seconds=step.step_seconds,
        hours=hours,
        total_cost=hours * price,
        note=note,
    )


def static_bytes(ctx: SearchContext) -> float:
    """(fp32 weights + gradients + optimizer state) x 1.2 for the model."""
    per_param = 4 + 4 + optimizer_state_bytes_per_param(ctx.optimizer, eight_bit=False)
    return per_param * ctx.shape.parameters * STATIC_MARGIN


def static_baseline(ctx: SearchContext, offers: Sequence[Offer], *, nodes: int = 1) -> BaselineResult | None:
    """fp32 DDP on the smallest GPU the static rule says fits (None when no GPU is big enough)."""
    need = static_bytes(ctx)
    big_enough = [o for o in offers if o.usable_bytes >= need]
    if not big_enough:
        return None
    offer = min(big_enough, key=lambda o: (o.usable_bytes, o.price_per_node_hour / o.gpus_per_node, o.pool))
    label = f"static {gib(need)} rule: fp32 DDP on {nodes}x{offer.gpus_per_node} {offer.product} ({offer.pool})"
    return fp32_baseline(ctx, offer, nodes=nodes, label=label)

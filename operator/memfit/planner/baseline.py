"""Baselines the savings are measured against.

- `plain_baseline`: what a practitioner runs without memfit: DDP with bf16 autocast (fp16 on GPUs
  without bf16), the job's optimizer in 32 bits, no checkpointing, no offload, at the largest
  micro-batch that fits, renting whole nodes, with a spot pool's interruptions priced as for the plan
  (planner.interruptions). `cheapest_plain_baseline` puts it on the allowed pool
  where it is cheapest (one whole node: DDP replicates the model, so more nodes never help it fit);
  this is the default baseline savings are reported against. `placement.baseline` names the pool
  and node count a user would have used; that declared baseline runs the same plain setup there and
  is reported beside the default.
- `fp32_baseline`: the same on fp32 (kept for the planner benchmark's history and `memfit plan`).
- `static_baseline`: the common static sizing rule: (weights + gradients + optimizer state) in fp32
  x 1.2, on the smallest GPU whose memory holds that, run as fp32 DDP on the baseline's node count.

The baseline is predicted by the same memory and time model as memfit's plan (with the same
measured-peak corrections), so the two costs compare like for like.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memfit.api.common import Precision
from memfit.api.training_config import PLAIN_FP32_DDP, TrainingConfig
from memfit.memory.predict import memory_terms
from memfit.memory.states import optimizer_state_bytes_per_param
from memfit.memory.strategy import Strategy
from memfit.memory.timing import time_terms
from memfit.planner.context import SearchContext
from memfit.planner.explain import gib
from memfit.planner.interruptions import expected_hours
from memfit.planner.offers import Offer
from memfit.planner.result import BaselineResult
from memfit.planner.space import divisors

# Static sizing margin: "(weights + grads + Adam) x 1.2" (the rule of thumb issue 4 compares against).
STATIC_MARGIN = 1.2


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
    requested = nodes * offer.gpus_per_node
    world = max(d for d in divisors(ctx.global_batch) if d <= requested)
    g = min(world, offer.gpus_per_node)
    note = "" if world == requested else (
        f"uses {world} of {requested} GPUs: training.globalBatchSize {ctx.global_batch} is not divisible by {requested}"
    )
    strategy = Strategy(config=config, optimizer=ctx.optimizer, world_size=world, gpus_per_node=g)
    terms = memory_terms(ctx.shape, strategy, calibration=ctx.calibration)
    factor = ctx.corrections.factor(strategy)
    if factor != 1.0:
        terms = terms.scaled(factor)
    per_gpu = ctx.samples_per_gpu(world)
    micro = 0
    for b in reversed(divisors(per_gpu)):
        if ctx.fits_gpu(terms.peak_bytes(b, per_gpu // b), offer.usable_bytes):
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
    # Interruptions priced as for memfit's plan (the same pool, checkpoints and model): both sides alike.
    hours = expected_hours(hours=ctx.steps * step.step_seconds / 3600, step_seconds=step.step_seconds,
                           rate_per_node_hour=offer.interruption_rate_per_hour, nodes=nodes,
                           checkpoint_every_steps=ctx.checkpoint_every_steps)
    if math.isinf(hours):
        fits = False
        note = "; ".join(filter(None, [note, "would not finish: interruptions come faster than it checkpoints"]))
    price = nodes * offer.price_per_node_hour  # whole nodes are rented, used or not
    return BaselineResult(
        label=label,
        pool=offer.pool,
        product=offer.product,
        nodes=nodes,
        world_size=world,
        micro_batch_size=micro,
        fits=fits,
        peak_bytes=int(-(-terms.peak_bytes(micro, per_gpu // micro) // 1)),
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

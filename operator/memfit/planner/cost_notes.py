"""Why the plan costs what it does, in plain words: the part of a node it uses, its checkpoint interval
and writes, and what a spot pool's interruptions add (or why it runs on-demand instead of a
cheaper-looking spot pool)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.planner.context import SearchContext
from memfit.planner.interruptions import (
    MAX_WRITE_OVERHEAD,
    ON_DEMAND_EVERY_STEPS,
    InterruptionRisk,
    interruption_risk,
    young_interval_hours,
)
from memfit.planner.offers import Offer
from memfit.planner.result import Candidate

NOTE_MAX = 300
NOTES_MAX = 8  # Plan.cost_notes holds at most 8


def cost_notes(ctx: SearchContext, chosen: Candidate, ranked: Sequence[Candidate],
               offers: Sequence[Offer]) -> tuple[str, ...]:
    """Notes for the chosen candidate (`ranked`: the best of each pool, chosen first)."""
    by_pool = {o.pool: o for o in offers}
    offer = by_pool.get(chosen.pool)
    if offer is None:
        return ()
    notes = [part_of_node_note(chosen, offer), interruption_note(ctx, chosen, offer),
             checkpoint_note(ctx, chosen, offer)]
    notes.extend(spot_passed_over_note(ctx, chosen, c, by_pool[c.pool]) for c in ranked[1:] if c.pool in by_pool)
    return tuple(n[:NOTE_MAX] for n in notes if n)[:NOTES_MAX]


def part_of_node_note(chosen: Candidate, offer: Offer) -> str:
    """`uses 2 of the 8 GPUs of a node other pods already use (a100-80): priced 2/8 of $27.45/h`."""
    k, per_node = chosen.strategy.gpus_per_node, offer.gpus_per_node
    if chosen.nodes != 1 or k >= per_node:
        return ""
    where = "a node other pods already use" if chosen.shared_node else "a node"
    rest = "" if chosen.shared_node else f"; the other {per_node - k} stay free for other pods"
    devices = f"MIG {offer.mig_profile} slices" if offer.mig_profile else "GPUs"
    return (f"uses {k} of the {per_node} {devices} of {where} ({offer.pool}): priced {k}/{per_node} of "
            f"${offer.price_per_node_hour:.2f}/h{rest}")


def _risk(ctx: SearchContext, candidate: Candidate, offer: Offer) -> InterruptionRisk:
    """The candidate's writes and interruptions, at the interval and write time the search priced."""
    seconds = candidate.step.step_seconds
    every, writes = ctx.candidate_checkpoints(candidate, offer)
    return interruption_risk(hours=ctx.steps * seconds / 3600, step_seconds=seconds,
                             rate_per_node_hour=offer.interruption_rate_per_hour, nodes=candidate.nodes,
                             checkpoint_every_steps=every, write_seconds=writes)


def _risk_words(ctx: SearchContext, candidate: Candidate, offer: Offer) -> tuple[float, str]:
    """(cost without interruptions, its checkpoint writes included and named; what the interruptions
    add in words)."""
    risk = _risk(ctx, candidate, offer)
    every, _ = ctx.candidate_checkpoints(candidate, offer)
    checkpoints = (f"checkpoints every {every} steps ({risk.checkpoint_hours:.2f} h)" if every is not None else
                   "no persistent checkpoint (training.checkpoint.emptyDir): one restarts from the start")
    words = (f"{offer.interruption_rate_per_hour:g} interruptions per node-hour ({offer.capacity_type}), "
             f"{checkpoints}")
    listed = (risk.hours + risk.writing_hours) * candidate.price_per_hour
    writes = risk.writing_hours * candidate.price_per_hour
    return listed, (f"{words}, ${writes:.2f} of it checkpoint writes" if writes >= 0.005 else words)


def checkpoint_note(ctx: SearchContext, chosen: Candidate, offer: Offer) -> str:
    """The checkpoint interval and why: `checkpoints every 240 steps (0.52 h), chosen by memfit: ...`."""
    every, writes = ctx.candidate_checkpoints(chosen, offer)
    if every is None:
        return ""
    risk = _risk(ctx, chosen, offer)
    if every >= ctx.steps and risk.rate_per_hour <= 0:
        return ""  # one checkpoint, at the end, and nothing to lose: no choice worth a note
    nodes = chosen.nodes
    written = ctx.checkpoint_bytes_per_node(chosen.strategy)
    each = (f"each writes {written / 1e9:.3g} GB from the busiest of {nodes} node{'s' * (nodes > 1)} in "
            f"{writes:.0f} s at {ctx.write_gbps(offer.pool):g} GB/s, "
            f"{100 * risk.writing_hours / max(risk.hours, 1e-12):.1f}% of the run")
    head = f"checkpoints every {every} steps ({risk.checkpoint_hours:.2f} h)"
    if not ctx.checkpoint.chosen:
        return f"{head}, training.checkpoint.everySteps; {each}"
    if risk.rate_per_hour > 0:
        young = young_interval_hours(write_hours=writes / 3600, rate_per_hour=risk.rate_per_hour)
        why = (f"chosen by memfit: the fewest expected hours at {risk.rate_per_hour:.3g} interruptions/h "
               f"(Young's sqrt(2 x write / rate) = {young:.2f} h)")
    else:
        why = (f"chosen by memfit: no interruptions priced here, so {ON_DEMAND_EVERY_STEPS} steps or the "
               f"fewer writes that keep them within {MAX_WRITE_OVERHEAD:.0%} of the run")
    return f"{head}, {why}; {each}; set everySteps to pin it"


def interruption_note(ctx: SearchContext, chosen: Candidate, offer: Offer) -> str:
    """What interruptions add to a plan on a pool that has them."""
    if offer.interruption_rate_per_hour <= 0:
        return ""
    listed, words = _risk_words(ctx, chosen, offer)
    return (f"interruptions priced as risk: ${listed:.2f} uninterrupted + ${chosen.total_cost - listed:.2f} "
            f"expected lost work and restarts = ${chosen.total_cost:.2f} ({words})")


def spot_passed_over_note(ctx: SearchContext, chosen: Candidate, other: Candidate, offer: Offer) -> str:
    """Why a pool that is cheaper before its interruptions was not chosen."""
    if offer.interruption_rate_per_hour <= 0:
        return ""
    listed, words = _risk_words(ctx, other, offer)
    if listed >= chosen.total_cost:
        return ""
    return (f"not {other.pool}: ${listed:.2f} uninterrupted but ${other.total_cost:.2f} expected with "
            f"{words}, more than ${chosen.total_cost:.2f} here")

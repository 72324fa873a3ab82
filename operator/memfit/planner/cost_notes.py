"""Why the plan costs what it does, in plain words: the part of a node it uses, and what a spot
pool's interruptions add (or why it runs on-demand instead of a cheaper-looking spot pool)."""

from __future__ import annotations

from collections.abc import Sequence

from memfit.planner.context import SearchContext
from memfit.planner.interruptions import interruption_risk
from memfit.planner.offers import Offer
from memfit.planner.result import Candidate

NOTE_MAX = 300


def cost_notes(ctx: SearchContext, chosen: Candidate, ranked: Sequence[Candidate],
               offers: Sequence[Offer]) -> tuple[str, ...]:
    """Notes for the chosen candidate (`ranked`: the best of each pool, chosen first)."""
    by_pool = {o.pool: o for o in offers}
    offer = by_pool.get(chosen.pool)
    if offer is None:
        return ()
    notes = [part_of_node_note(chosen, offer), interruption_note(ctx, chosen, offer)]
    notes.extend(spot_passed_over_note(ctx, chosen, c, by_pool[c.pool]) for c in ranked[1:] if c.pool in by_pool)
    return tuple(n[:NOTE_MAX] for n in notes if n)


def part_of_node_note(chosen: Candidate, offer: Offer) -> str:
    """`uses 2 of the 8 GPUs of a node other pods already use (a100-80): priced 2/8 of $27.45/h`."""
    k, per_node = chosen.strategy.gpus_per_node, offer.gpus_per_node
    if chosen.nodes != 1 or k >= per_node:
        return ""
    where = "a node other pods already use" if chosen.shared_node else "a node"
    rest = "" if chosen.shared_node else f"; the other {per_node - k} stay free for other pods"
    return (f"uses {k} of the {per_node} GPUs of {where} ({offer.pool}): priced {k}/{per_node} of "
            f"${offer.price_per_node_hour:.2f}/h{rest}")


def _risk_words(ctx: SearchContext, candidate: Candidate, offer: Offer) -> tuple[float, str]:
    """(cost without interruptions, what the interruptions add in words)."""
    seconds = candidate.step.step_seconds
    risk = interruption_risk(hours=ctx.steps * seconds / 3600, step_seconds=seconds,
                             rate_per_node_hour=offer.interruption_rate_per_hour, nodes=candidate.nodes,
                             checkpoint_every_steps=ctx.checkpoint_every_steps)
    checkpoints = (f"checkpoints every {ctx.checkpoint_every_steps} steps ({risk.checkpoint_hours:.2f} h)"
                   if ctx.checkpoint_every_steps is not None else
                   "no persistent checkpoint (training.checkpoint.emptyDir): one restarts from the start")
    words = (f"{offer.interruption_rate_per_hour:g} interruptions per node-hour ({offer.capacity_type}), "
             f"{checkpoints}")
    return risk.hours * candidate.price_per_hour, words


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

"""Regret guard: what memfit's plan is worth when the true peak is not the predicted one.

With true peak = predicted peak x f, memfit's plan runs out of memory when its true peak exceeds the
GPU's usable memory. An oracle that knows f plans the cheapest candidate whose true peak fits: the same
search with the fit rule `predicted x f <= usable` (headroom f - 1, which may be negative; the oracle
needs no margin). Regret = memfit's objective (cost, or hours when minimizing time) over the oracle's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memfit.api.job import Minimize
from memfit.planner.context import SearchContext
from memfit.planner.offers import Offer
from memfit.planner.result import Candidate
from memfit.planner.search import best_on_offer, objective_key
from memfit.planner.space import Choice


@dataclass(frozen=True, slots=True)
class Regret:
    """memfit's plan against the oracle at one peak factor."""

    factor: float
    planned: float  # memfit's objective: total cost, or hours
    oracle: float | None  # None: no candidate's true peak fits
    out_of_memory: bool

    @property
    def ratio(self) -> float | None:
        """memfit's objective over the oracle's (None without an oracle)."""
        if self.oracle is None or self.oracle <= 0:
            return None
        return self.planned / self.oracle


def out_of_memory(candidate: Candidate, factor: float) -> bool:
    """Whether the candidate's true peak (predicted x factor) exceeds its GPU's usable memory."""
    return candidate.memory.peak_bytes * factor > candidate.usable_bytes


def oracle_context(ctx: SearchContext, factor: float) -> SearchContext:
    """The job's context with the oracle's fit rule (predicted x factor <= usable) and fresh caches.
    `factor` is a whole number of percent (0.9, 1.1): the context counts headroom in percent."""
    headroom = round(100 * (factor - 1))
    if abs(headroom - 100 * (factor - 1)) > 1e-6 or factor <= 0:
        raise ValueError(f"peak factor {factor} is not a positive whole number of percent")
    return ctx.with_fresh_caches(headroom_percent=headroom)


def oracle_plan(ctx: SearchContext, offers: Sequence[Offer], choices: Sequence[Choice], *,
                factor: float) -> Candidate | None:
    """The best candidate over `offers` whose true peak fits (None when none does)."""
    oracle_ctx = oracle_context(ctx, factor)
    found = [o.best for o in (best_on_offer(oracle_ctx, offer, choices) for offer in offers) if o.best is not None]
    return min(found, key=lambda c: (*objective_key(c, ctx.minimize), c.pool), default=None)


def objective(candidate: Candidate, minimize: Minimize) -> float:
    """The value the job minimizes: hours, or total cost."""
    return candidate.hours if minimize == Minimize.TIME else candidate.total_cost


def regret(chosen: Candidate, oracle: Candidate | None, *, factor: float,
           minimize: Minimize = Minimize.COST) -> Regret:
    """memfit's chosen plan against the oracle's at `factor`."""
    return Regret(factor=factor, planned=objective(chosen, minimize),
                  oracle=objective(oracle, minimize) if oracle is not None else None,
                  out_of_memory=out_of_memory(chosen, factor))

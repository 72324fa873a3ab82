"""Actual spend: GPU-hours x price of every finished profiling run and training attempt (failed ones
included), from the status alone, so a decision recomputes it and a repeat writes nothing new."""

from __future__ import annotations

from datetime import datetime

from memfit.api.job import Attempt, PlanSummary, Spend, SpendItem
from memfit.api.plan import round_cost


def attempt_spend(attempt: Attempt) -> SpendItem | None:
    """A finished attempt's spend; None while it runs or when its price was not recorded."""
    if attempt.started_at is None or attempt.finished_at is None or attempt.price_per_hour is None:
        return None
    return run_spend(kind="training", attempt=attempt.index, node_pool=attempt.node_pool,
                     outcome=attempt.outcome.value, gpus=attempt.gpus or attempt.nodes,
                     started=attempt.started_at, finished=attempt.finished_at,
                     price_per_hour=attempt.price_per_hour)


def run_spend(*, kind: str, attempt: int | None, node_pool: str, outcome: str, gpus: int, started: datetime,
              finished: datetime, price_per_hour: float) -> SpendItem:
    seconds = max(0.0, (finished - started).total_seconds())
    hours = seconds / 3600
    return SpendItem(kind=kind, attempt=attempt, node_pool=node_pool, outcome=outcome[:32], gpus=gpus,
                     seconds=seconds, gpu_hours=round_cost(hours * gpus), price_per_hour=round_cost(price_per_hour),
                     cost=round_cost(hours * price_per_hour))


def spend_of(profiling: SpendItem | None, attempts: list[Attempt], plan: PlanSummary | None) -> Spend | None:
    """The status spend; None before anything has finished (and no plan)."""
    items = [i for i in (profiling, *(attempt_spend(a) for a in attempts)) if i is not None]
    if not items and plan is None:
        return None
    return Spend(
        items=items[-34:],
        gpu_hours=round_cost(sum(i.gpu_hours for i in items)),
        total=round_cost(sum(i.cost for i in items)),
        predicted=plan.estimated_cost if plan is not None else None,
    )

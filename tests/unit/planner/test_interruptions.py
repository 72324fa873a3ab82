"""Spot priced as risk: expected hours with lost work and restarts, and the pool choice it changes."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import pytest
from memfit.api.common import PeftMethod
from memfit.api.validation import validate_document
from memfit.catalog import CATALOG
from memfit.planner import plan
from memfit.planner.checkpoint_writes import checkpoint_bytes
from memfit.planner.interruptions import (
    RESTART_SECONDS,
    chosen_every_steps,
    expected_hours,
    interruption_risk,
    priced_every_steps,
    young_interval_hours,
)
from memfit.planner.offers import Offer, resolve_offer
from memfit.planner.plan_job import resolve_shape, search_context
from planner_factories import make_job, make_pool

RESTART_HOURS = RESTART_SECONDS / 3600
RISK = {
    # (hours, step seconds, rate per node-hour, nodes, checkpoint every steps) -> expected hours
    "on-demand: no risk": ((10.0, 1.0, 0.0, 1, None), 10.0),
    "checkpoint every hour": ((10.0, 1.0, 0.05, 1, 3600), 10.0 / (1 - 0.05 * (0.5 + RESTART_HOURS))),
    "two nodes: twice the rate": ((10.0, 1.0, 0.05, 2, 3600), 10.0 / (1 - 0.1 * (0.5 + RESTART_HOURS))),
    "no persistent checkpoint: half the run lost": ((4.0, 1.0, 0.05, 1, None), 4.0 / (1 - 0.05 * (2 + RESTART_HOURS))),
    "checkpoint interval longer than the run": ((1.0, 10.0, 0.05, 1, 10_000), 1.0 / (1 - 0.05 * (0.5 + RESTART_HOURS))),
    "interruptions faster than the work is saved": ((50.0, 1.0, 0.05, 1, None), math.inf),
    # With a write of 36 s (0.01 h) per checkpoint: one after each of the 10 intervals, the last included.
    "writes on-demand: 10 of them": ((10.0, 1.0, 0.0, 1, 3600, 36.0), 10.0 + 10 * 0.01),
    "writes and interruptions: the write is part of the segment lost": (
        (10.0, 1.0, 0.05, 1, 3600, 36.0), (10.0 + 10 * 0.01) / (1 - 0.05 * ((1 + 0.01) / 2 + RESTART_HOURS))),
    "one interval: the final checkpoint is written too": ((1.0, 10.0, 0.0, 1, 10_000, 36.0), 1.01),
    "no persistent checkpoint: writes not priced": ((4.0, 1.0, 0.05, 1, None, 36.0),
                                                    4.0 / (1 - 0.05 * (2 + RESTART_HOURS))),
}


@pytest.mark.parametrize("case", RISK, ids=list(RISK))
def test_expected_hours(case: str) -> None:
    (hours, seconds, rate, nodes, every, *writes), expected = RISK[case]
    write = writes[0] if writes else 0.0
    got = expected_hours(hours=hours, step_seconds=seconds, rate_per_node_hour=rate, nodes=nodes,
                         checkpoint_every_steps=every, write_seconds=write)
    assert got == pytest.approx(expected)
    risk = interruption_risk(hours=hours, step_seconds=seconds, rate_per_node_hour=rate, nodes=nodes,
                             checkpoint_every_steps=every, write_seconds=write)
    assert risk.expected_hours == pytest.approx(expected)
    if rate == 0:  # without interruptions the run is its work and its writes
        assert risk.hours + risk.writing_hours == pytest.approx(expected)


def test_the_pool_rate_overrides_the_catalog_default_of_its_capacity_type() -> None:
    spot = resolve_offer(make_pool("s", "l4", capacityType="spot"), catalog=CATALOG)
    own = resolve_offer(make_pool("o", "l4", capacityType="spot", interruptionRatePerHour=0.5), catalog=CATALOG)
    on_demand = resolve_offer(make_pool("d", "l4"), catalog=CATALOG)
    assert isinstance(spot, Offer) and isinstance(own, Offer) and isinstance(on_demand, Offer)
    assert (spot.interruption_rate_per_hour, own.interruption_rate_per_hour, on_demand.interruption_rate_per_hour) == (
        CATALOG.interruption_rate("spot"), 0.5, 0.0)
    assert CATALOG.interruption_rate("spot") > 0 == CATALOG.interruption_rate("reserved")


def spot_job(*, steps: int, checkpoint: dict[str, Any] | None = None, max_nodes: int | None = None) -> Any:
    job = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).steps(steps)
    if checkpoint is not None:
        job.spec["training"]["checkpoint"] = checkpoint
    if max_nodes is not None:
        job.spec.setdefault("placement", {})["maxNodes"] = max_nodes
    return job.build()


def pools(rate: float) -> list[Any]:
    return [make_pool("l4-spot", "l4", price=0.35, capacityType="spot", interruptionRatePerHour=rate),
            make_pool("l4", "l4", price=0.805)]


def test_on_demand_wins_when_spot_interruptions_cost_more_and_the_plan_says_why() -> None:
    # About 3.3 h on one L4 (one node: the rate below is per node-hour), no persistent checkpoint.
    job = spot_job(steps=20_000, checkpoint={"emptyDir": True}, max_nodes=1)
    calm = plan(job, pools=pools(0.0), catalog=CATALOG)
    assert calm.chosen is not None and calm.chosen.pool == "l4-spot"
    hours = calm.chosen.hours
    # A rate at which spot's expected hours are 3x: dearer than on-demand's 2.3x price.
    rate = (2 / 3) / (hours / 2 + RESTART_HOURS)
    risky = plan(job, pools=pools(rate), catalog=CATALOG)
    assert risky.chosen is not None and risky.chosen.pool == "l4"
    assert risky.plan is not None
    (note,) = [n for n in risky.plan.cost_notes if n.startswith("not l4-spot")]
    assert f"${0.35 * hours:.2f} uninterrupted but ${0.35 * hours * 3:.2f} expected" in note
    assert "no persistent checkpoint" in note and f"more than ${risky.chosen.total_cost:.2f} here" in note
    # The practitioner rents the cheapest GPU per hour, spot included, and pays the same risk there:
    # moving to on-demand is part of what memfit saves.
    assert risky.baseline is not None and risky.baseline.pool == "l4-spot"
    assert risky.chosen.total_cost < risky.baseline.total_cost


@pytest.mark.parametrize("checkpoint", [{"volumeClaim": "ckpt", "everySteps": 100}, {"everySteps": 100}],
                         ids=["named claim", "the operator's default claim"])
def test_checkpoints_on_a_volume_make_spot_cheap_again_and_its_risk_is_in_the_cost(checkpoint: dict[str, Any]) -> None:
    job = spot_job(steps=20_000, checkpoint=checkpoint)
    calm = plan(job, pools=pools(0.0), catalog=CATALOG)
    assert calm.chosen is not None
    rate = (2 / 3) / (calm.chosen.hours / 2 + RESTART_HOURS)
    risky = plan(job, pools=pools(rate), catalog=CATALOG)
    assert risky.chosen is not None and risky.chosen.pool == "l4-spot" and risky.plan is not None
    assert risky.chosen.total_cost > calm.chosen.total_cost  # lost work and restarts are priced in
    (note,) = [n for n in risky.plan.cost_notes if n.startswith("interruptions priced as risk")]
    assert "checkpoints every 100 steps" in note and f"= ${risky.chosen.total_cost:.2f}" in note


def test_a_spot_pool_where_the_run_would_never_finish_is_rejected_with_the_reason() -> None:
    result = plan(spot_job(steps=200_000, checkpoint={"emptyDir": True}), pools=pools(0.5)[:1], catalog=CATALOG)
    assert result.plan is None
    assert "no run on it would finish" in result.message()
    assert "at 0.5 interruptions per node-hour (spot)" in result.message()
    assert "keep checkpoints on a claim instead of an emptyDir" in result.message()


@pytest.mark.parametrize("value", [-0.1, 101, "often"])
def test_interruption_rate_is_validated_with_its_field_path(value: object) -> None:
    doc = {"apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool", "metadata": {"name": "p"},
           "spec": {"gpu": {"product": "l4"}, "interruptionRatePerHour": value}}
    loaded, problems = validate_document(doc, "pools.yaml")
    assert loaded is None
    assert [p.path for p in problems] == ["spec.interruptionRatePerHour"]


def hours_at(every: int, *, steps: int, seconds: float, write: float, rate: float) -> float:
    return expected_hours(hours=steps * seconds / 3600, step_seconds=seconds, rate_per_node_hour=rate, nodes=1,
                          checkpoint_every_steps=every, write_seconds=write)


def test_youngs_interval_on_a_hand_made_case() -> None:
    # A 72 s write (0.02 h), 0.1 interruptions an hour: Young's sqrt(2 C / rate) = sqrt(0.4) h.
    assert young_interval_hours(write_hours=0.02, rate_per_hour=0.1) == pytest.approx(math.sqrt(0.4))
    steps, seconds, write, rate = 1_000_000, 1.0, 72.0, 0.1
    every = chosen_every_steps(steps=steps, step_seconds=seconds, write_seconds=write, rate_per_hour=rate)
    # The model's own minimiser: -C + sqrt(C^2 + 2 C (1 - rate (C/2 + R)) / rate), Young's less about C.
    left = 1 - rate * (0.01 + RESTART_HOURS)
    assert every * seconds / 3600 == pytest.approx(-0.02 + math.sqrt(0.02**2 + 2 * 0.02 * left / rate), abs=1 / 3600)
    assert 0.95 < every / (math.sqrt(0.4) * 3600) < 1.0
    best = hours_at(every, steps=steps, seconds=seconds, write=write, rate=rate)
    young = round(math.sqrt(0.4) * 3600)
    for other in (every // 2, 2 * every, young, every - 1, every + 1):
        assert best <= hours_at(other, steps=steps, seconds=seconds, write=write, rate=rate)


CHOSEN = {
    # (steps, step seconds, write seconds, rate per hour) -> steps between checkpoints
    "on-demand: the old 500": ((20_000, 1.0, 2.0, 0.0), 500),
    "on-demand: more steps where writes would pass 1 %": ((20_000, 1.0, 60.0, 0.0), 6000),
    "on-demand: a short run checkpoints once, at the end": ((100, 1.0, 2.0, 0.0), 100),
    "spot: never beyond the run": ((50, 1.0, 600.0, 0.01), 50),
    "spot: at least one step": ((1000, 3600.0, 0.001, 0.5), 1),
}


@pytest.mark.parametrize("case", CHOSEN, ids=list(CHOSEN))
def test_chosen_interval(case: str) -> None:
    (steps, seconds, write, rate), expected = CHOSEN[case]
    assert chosen_every_steps(steps=steps, step_seconds=seconds, write_seconds=write, rate_per_hour=rate) == expected


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.5])
def test_expected_hours_at_the_chosen_interval_never_fall_as_steps_get_slower(rate: float) -> None:
    """The search prices a lower bound on step seconds and relies on this."""
    def hours(seconds: float, write: float) -> float:
        every = priced_every_steps(steps=5000, step_seconds=seconds, write_seconds=write, rate_per_hour=rate)
        return expected_hours(hours=5000 * seconds / 3600, step_seconds=seconds, rate_per_node_hour=rate, nodes=1,
                              checkpoint_every_steps=every, write_seconds=write)

    grid = [0.05 * 1.07**i for i in range(120)]
    for write in (1.0, 30.0, 300.0):
        values = [hours(s, write) for s in grid]
        assert all(a <= b * (1 + 1e-12) for a, b in pairwise(values))
    # and as writes get slower (the search bounds those too, and prices 32-bit twins from 8-bit ones)
    for seconds in (0.05, 2.0):
        values = [hours(seconds, w) for w in grid]
        assert all(a <= b * (1 + 1e-12) for a, b in pairwise(values))


def spot_pool(rate: float, **host: Any) -> Any:
    return make_pool("l4-spot", "l4", price=0.35, capacityType="spot", interruptionRatePerHour=rate,
                     host=host)


def test_memfit_chooses_the_interval_and_the_plan_carries_it() -> None:
    job = spot_job(steps=20_000, checkpoint={"volumeClaim": "ckpt"})
    result = plan(job, pools=[spot_pool(0.2, checkpointWriteGBps=0.5)], catalog=CATALOG)
    assert result.plan is not None and result.chosen is not None
    chosen = result.chosen
    strategy = chosen.strategy
    assert job.training.checkpoint.every_steps is None
    assert strategy.config.peft == PeftMethod.NONE
    shape = resolve_shape(job, None)
    assert not isinstance(shape, str)
    ctx = search_context(job, shape)
    written = checkpoint_bytes(ctx.shape, strategy, trainable=ctx.shape.trainable).per_node(chosen.nodes)
    write = written / 0.5e9  # the pool's 0.5 GB/s, not the default
    expected = chosen_every_steps(steps=20_000, step_seconds=chosen.step.step_seconds, write_seconds=write,
                                  rate_per_hour=0.2 * chosen.nodes)
    assert 1 < expected < 20_000
    assert result.plan.checkpoint_every_steps == expected == result.plan.checkpoint_interval_steps
    assert chosen.hours == pytest.approx(expected_hours(
        hours=20_000 * chosen.step.step_seconds / 3600, step_seconds=chosen.step.step_seconds,
        rate_per_node_hour=0.2, nodes=chosen.nodes, checkpoint_every_steps=expected, write_seconds=write))
    (note,) = [n for n in result.plan.cost_notes if n.startswith("checkpoints every")]
    assert note.startswith(f"checkpoints every {expected} steps") and "chosen by memfit" in note
    assert "Young's" in note and "at 0.5 GB/s" in note
    # The search's cost at the chosen interval is no more than at half or twice it (pinned).
    for pinned in (expected // 2, 2 * expected):
        other = plan(spot_job(steps=20_000, checkpoint={"volumeClaim": "ckpt", "everySteps": pinned}),
                     pools=[spot_pool(0.2, checkpointWriteGBps=0.5)], catalog=CATALOG)
        assert other.chosen is not None and other.plan is not None
        assert other.plan.checkpoint_every_steps == pinned
        assert result.chosen.total_cost <= other.chosen.total_cost


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.5])
def test_a_pinned_interval_is_kept_whatever_the_risk(rate: float) -> None:
    job = spot_job(steps=20_000, checkpoint={"volumeClaim": "ckpt", "everySteps": 100})
    result = plan(job, pools=[spot_pool(rate)], catalog=CATALOG)
    assert result.plan is not None
    assert result.plan.checkpoint_every_steps == 100 == result.plan.checkpoint_interval_steps
    (note,) = [n for n in result.plan.cost_notes if n.startswith("checkpoints every")]
    assert "training.checkpoint.everySteps" in note and "chosen by memfit" not in note


def test_slower_checkpoint_storage_checkpoints_less_often_and_costs_more() -> None:
    job = spot_job(steps=20_000, checkpoint={"volumeClaim": "ckpt"})
    fast = plan(job, pools=[spot_pool(0.2, checkpointWriteGBps=2.0)], catalog=CATALOG)
    slow = plan(job, pools=[spot_pool(0.2, checkpointWriteGBps=0.05)], catalog=CATALOG)
    assert fast.plan is not None and slow.plan is not None and fast.chosen is not None and slow.chosen is not None
    assert fast.plan.checkpoint_every_steps is not None and slow.plan.checkpoint_every_steps is not None
    assert slow.plan.checkpoint_every_steps > fast.plan.checkpoint_every_steps
    assert slow.chosen.total_cost > fast.chosen.total_cost


@pytest.mark.parametrize("value", [0, -1.5, 1e6, "fast"])
def test_checkpoint_write_bandwidth_is_validated_with_its_field_path(value: object) -> None:
    doc = {"apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool", "metadata": {"name": "p"},
           "spec": {"gpu": {"product": "l4"}, "host": {"checkpointWriteGBps": value}}}
    loaded, problems = validate_document(doc, "pools.yaml")
    assert loaded is None
    assert [p.path for p in problems] == ["spec.host.checkpointWriteGBps"]

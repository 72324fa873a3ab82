"""Regret guard: memfit's plan when the true peak is the predicted one x f, against an oracle that knows f."""

from __future__ import annotations

import pytest
from memfit.api.job import Minimize
from memfit.catalog import CATALOG
from memfit.planner import plan, resolve_offers, resolve_shape, search_context
from memfit.planner.regret import Regret, oracle_context, oracle_plan, out_of_memory, regret
from memfit.planner.space import strategy_choices
from planner_factories import make_job, make_pool

MIB = 1024**2
# One configuration only, so the peak is known before the pools are sized around it.
PINNED = make_job().gpt(layers=8, hidden=512, heads=8, sequenceLength=1024).batch(8).steps(1000).pin(
    engine="ddp", precision="bf16", activationCheckpointing="none", optimizer8bit="disabled", microBatchSize=8)


def test_regret_is_planned_over_oracle_cost() -> None:
    assert Regret(factor=1.2, planned=10.0, oracle=20.0, out_of_memory=True).ratio == 0.5
    assert Regret(factor=0.9, planned=10.0, oracle=8.0, out_of_memory=False).ratio == 1.25
    assert Regret(factor=1.2, planned=10.0, oracle=None, out_of_memory=True).ratio is None


def test_hand_made_case_oom_at_1_2_and_the_oracle_pays_for_the_bigger_gpu() -> None:
    spec = PINNED.build()
    probe = plan(spec, pools=[make_pool("l4", "l4", max_nodes=1)], catalog=CATALOG).chosen
    assert probe is not None
    peak_mib = probe.memory.peak_bytes / MIB
    # "small" holds the peak x 1.15 (enough for memfit's 10 % headroom), "big" twice that at twice the price:
    # same GPU speed, so the same hours.
    pools = [make_pool("small", "l4", memory_mib=int(peak_mib * 1.15), price=1.0, max_nodes=1),
             make_pool("big", "l4", memory_mib=int(peak_mib * 2.3), price=2.0, max_nodes=1)]
    result = plan(spec, pools=pools, catalog=CATALOG)
    chosen = result.chosen
    assert chosen is not None and chosen.pool == "small"
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    ctx = search_context(spec, shape)
    offers, _ = resolve_offers(pools, catalog=CATALOG)
    choices, _ = strategy_choices(spec.strategy)
    by_factor = {f: regret(chosen, oracle_plan(ctx, offers, choices, factor=f), factor=f) for f in (0.9, 1.1, 1.2)}
    # Below 1.15 the small GPU holds the true peak: memfit's plan is the oracle's.
    for f in (0.9, 1.1):
        assert not by_factor[f].out_of_memory and by_factor[f].ratio == pytest.approx(1.0)
    # At 1.2 memfit's plan runs out of memory; the oracle needed the big GPU at twice the price.
    assert by_factor[1.2].out_of_memory and by_factor[1.2].ratio == pytest.approx(0.5, rel=1e-3)
    assert out_of_memory(chosen, 1.2) and not out_of_memory(chosen, 1.1)


def test_oracle_fit_rule_is_predicted_times_f_without_headroom() -> None:
    spec = make_job().headroom(20).build()
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    ctx = search_context(spec, shape)
    assert oracle_context(ctx, 0.8).fits_gpu(125, 100) and not oracle_context(ctx, 0.8).fits_gpu(126, 100)
    assert oracle_context(ctx, 1.1).fits_gpu(90, 100) and not oracle_context(ctx, 1.1).fits_gpu(91, 100)
    with pytest.raises(ValueError, match="whole number of percent"):
        oracle_context(ctx, 1.005)


def test_regret_in_hours_when_the_job_minimizes_time() -> None:
    result = plan(make_job().build(), pools=[make_pool("l4", "l4")], catalog=CATALOG)
    assert result.chosen is not None
    r = regret(result.chosen, result.chosen, factor=1.1, minimize=Minimize.TIME)
    assert r.planned == result.chosen.hours and r.ratio == 1.0

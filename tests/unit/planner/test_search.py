"""The branch-and-bound search finds what an exhaustive search finds, deterministically."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.planner import plan
from planner_factories import brute_force_cost, make_job, make_pool

PRODUCTS = ["t4", "l4", "a10g", "l40s", "a100-40", "h100-80"]


@st.composite
def specs_and_pools(draw: st.DrawFn) -> tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]]:
    heads = draw(st.sampled_from([4, 8]))
    job = (
        make_job()
        .gpt(kind=draw(st.sampled_from(["gpt", "bert", "vit"])), layers=draw(st.integers(2, 12)),
             hidden=heads * draw(st.sampled_from([32, 64, 128])), heads=heads,
             vocab=draw(st.sampled_from([1000, 32000])), sequenceLength=draw(st.sampled_from([128, 512])))
        .batch(draw(st.sampled_from([4, 6, 8, 16])))
        .optimizer(draw(st.sampled_from(["adamw", "sgd"])))
        .headroom(draw(st.sampled_from([0, 10, 25])))
        .max_nodes(draw(st.integers(1, 2)))
        .build()
    )
    pools = [
        make_pool(f"p{i}", draw(st.sampled_from(PRODUCTS)), per_node=draw(st.sampled_from([1, 2, 4])),
                  memory_mib=draw(st.sampled_from([1200, 2500, 5000, 20000])), max_nodes=2,
                  host_gib=draw(st.sampled_from([1, 4, 64])))
        for i in range(draw(st.integers(1, 3)))
    ]
    return job, pools


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(specs_and_pools())
def test_planner_cost_equals_brute_force(case: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]]) -> None:
    spec, pools = case
    result = plan(spec, pools=pools)
    expected = brute_force_cost(spec, pools)
    if expected is None:
        assert result.plan is None and result.rejections
    else:
        assert result.chosen is not None
        assert result.chosen.total_cost == pytest.approx(expected, rel=1e-9)


def test_same_inputs_same_plan_whatever_the_pool_order() -> None:
    spec = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).build()
    pools = [make_pool(p, p, per_node=4) for p in PRODUCTS]
    first = plan(spec, pools=pools)
    again = plan(spec, pools=list(reversed(pools)))
    assert first.plan == again.plan
    assert [a.describe() for a in first.alternatives] == [a.describe() for a in again.alternatives]
    assert first.rejections == again.rejections


def test_ties_break_on_pool_name() -> None:
    spec = make_job().build()
    twins = [make_pool("b-pool", "l4"), make_pool("a-pool", "l4")]
    assert plan(spec, pools=twins).plan.node_pool == "a-pool"  # type: ignore[union-attr]

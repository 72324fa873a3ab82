"""The branch-and-bound search finds what an exhaustive search finds, deterministically."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfit.api.common import Engine
from memfit.api.job import MemoryOptimizedTrainingJobSpec, Minimize
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.mig import profiles
from memfit.planner import PlanResult, plan, resolve_offers, resolve_shape, search, search_context
from memfit.planner.reference import best_objective
from memfit.planner.search import TIE_TOLERANCE, best_on_offer, objective_key, tier
from memfit.planner.space import strategy_choices
from planner_factories import make_job, make_pool

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


@st.composite
def varied_specs_and_pools(draw: st.DrawFn) -> tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]]:
    """Wider than `specs_and_pools`: either objective, pinned precision, GPU memory anywhere between
    "nothing fits" and "everything fits" (so the fit boundary falls between micro-batches and
    accumulation regimes), larger per-GPU batches."""
    heads = draw(st.sampled_from([4, 8, 16]))
    layers, hidden = draw(st.integers(2, 32)), heads * draw(st.sampled_from([32, 64, 128]))
    vocab = draw(st.sampled_from([1000, 32000, 50257]))
    spec = (
        make_job()
        .gpt(kind=draw(st.sampled_from(["gpt", "bert", "vit"])), layers=layers, hidden=hidden, heads=heads,
             vocab=vocab, sequenceLength=draw(st.sampled_from([128, 512, 1024])))
        .batch(draw(st.sampled_from([1, 2, 4, 8, 12, 32])))
        .optimizer(draw(st.sampled_from(["adamw", "sgd"])))
        .headroom(draw(st.sampled_from([0, 10, 25])))
        .max_nodes(draw(st.integers(1, 2)))
        .build()
    )
    # GPU memory between "nothing fits" and "everything fits": 1-24 bytes per parameter.
    approx_parameters = 12 * layers * hidden**2 + vocab * hidden
    body = spec.model_dump(by_alias=True, exclude_none=True)
    body["training"]["maxSteps"] = draw(st.sampled_from([10, 1000]))
    body["objective"]["minimize"] = draw(st.sampled_from(["cost", "time"]))
    body["strategy"]["precision"] = draw(st.sampled_from(["auto", "auto", "fp16", "fp32", "bf16-pure"]))
    body["strategy"]["allowPureBf16"] = draw(st.booleans())
    if body["strategy"]["precision"] != "fp16":
        body["strategy"]["optimizerInBackward"] = draw(st.sampled_from(["auto", "auto", "enabled", "disabled"]))
    body["strategy"]["chunkedLoss"] = draw(st.sampled_from(["auto", "auto", "disabled"]))
    body["strategy"]["activationOffload"] = draw(st.sampled_from(["auto", "auto", "disabled", "enabled"]))
    pools = [
        make_pool(f"p{i}", product, per_node=draw(st.sampled_from([1, 2, 4])),
                  memory_mib=max(200, int(approx_parameters * draw(st.floats(1.0, 24.0)) / 2**20)), max_nodes=2,
                  host_gib=draw(st.sampled_from([1, 4, 64])), gpu_extra=draw(_mig_of(product)))
        for i, product in enumerate(draw(st.lists(st.sampled_from(PRODUCTS), min_size=1, max_size=2)))
    ]
    return MemoryOptimizedTrainingJobSpec.model_validate(body), pools


def _mig_of(product: str) -> st.SearchStrategy[dict[str, object] | None]:
    """Whole GPUs, or (a MIG-capable GPU) slices of one of its profiles: one process per plan."""
    names = [p.name for p in profiles(CATALOG.find(product))]
    return st.one_of(st.none(), st.sampled_from([{"mig": {"profile": n}} for n in names])) if names else st.none()


def _objective(spec: MemoryOptimizedTrainingJobSpec, chosen: object) -> float:
    assert chosen is not None
    return float(chosen.hours if spec.objective.minimize == Minimize.TIME else chosen.total_cost)  # type: ignore[attr-defined]


def _assert_equals_exhaustive(spec: MemoryOptimizedTrainingJobSpec, pools: list[GPUNodePool]) -> PlanResult:
    """The planner's choice costs exactly what the exhaustive search's does (or neither finds a plan)."""
    result = plan(spec, pools=pools, catalog=CATALOG)
    expected = best_objective(spec, pools, catalog=CATALOG)
    if expected is None:
        assert result.plan is None
    else:
        assert _objective(spec, result.chosen) == pytest.approx(expected, rel=1e-9)
    return result


# 150 random specs (the planner benchmark checks 200 more at every campaign): the planner's choice costs exactly what the exhaustive search's does.
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(varied_specs_and_pools())
def test_planner_objective_equals_exhaustive_search(
    case: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]],
) -> None:
    spec, pools = case
    result = _assert_equals_exhaustive(spec, pools)
    assert result.plan is not None or result.rejections


@st.composite
def checkpointed_specs_and_pools(draw: st.DrawFn) -> tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]]:
    """`varied_specs_and_pools` with spot pools, slow or fast checkpoint storage and every checkpoint
    policy (memfit's interval, a pinned one, none persistent): the write cost and the chosen interval
    must keep the search's bounds valid."""
    spec, pools = draw(varied_specs_and_pools())
    body = spec.model_dump(by_alias=True, exclude_none=True)
    body["training"]["maxSteps"] = draw(st.sampled_from([10, 1000, 100_000]))
    body["training"]["checkpoint"] = draw(st.sampled_from([{}, {}, {"everySteps": 7}, {"emptyDir": True}]))
    varied = []
    for pool in pools:
        doc = pool.model_dump(by_alias=True, exclude_none=True)
        if draw(st.booleans()):
            doc["spec"] |= {"capacityType": "spot", "interruptionRatePerHour": draw(st.sampled_from([0.01, 0.2, 2.0]))}
        doc["spec"]["host"]["checkpointWriteGBps"] = draw(st.sampled_from([0.0001, 0.01, 1.0]))
        varied.append(GPUNodePool.model_validate(doc))
    return MemoryOptimizedTrainingJobSpec.model_validate(body), varied


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(checkpointed_specs_and_pools())
def test_planner_objective_equals_exhaustive_search_with_checkpoint_writes_and_spot(
    case: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]],
) -> None:
    _assert_equals_exhaustive(*case)


def test_planner_finds_the_whole_batch_in_one_micro_step_when_accumulating_does_not_fit() -> None:
    """Accumulating keeps the gradients next to the activations, so micro-batch = per-GPU batch (no
    accumulation) can fit where micro-batch 1 does not (seed 20260 case 50 of benchmarks/planner.py)."""
    spec = (make_job().gpt(kind="bert", layers=32, hidden=2048, heads=16, vocab=50257, sequenceLength=1024)
            .batch(4).headroom(0).max_nodes(1).build())
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    ctx = search_context(spec, shape)
    choices, _ = strategy_choices(spec.strategy)
    probe = make_pool("probe", "l4", per_node=1)
    offer = resolve_offers([probe], catalog=CATALOG)[0][0]
    layout = offer.layouts(1)[0]
    # A configuration whose whole-batch step peaks below its micro-batch-1 step with accumulation.
    found = None
    for choice in choices:
        terms = ctx.memory(choice, 1, 1)
        one, whole = terms.peak_bytes(1, 4), terms.peak_bytes(4, 1)
        if whole < one:
            found = (choice, one, whole)
            break
    assert found is not None, "the memory model has no regime where accumulating costs more than it saves"
    choice, one, whole = found
    assert ctx.min_peak(choice, layout) == int(-(-whole // 1))
    assert ctx.min_peak_micro_batch(choice, layout) == 4
    # A pool whose GPU holds the whole-batch step but not micro-batch 1 with accumulation.
    usable_mib = int((one + whole) / 2 / 2**20) + 1
    tight = make_pool("tight", "l4", per_node=1, memory_mib=usable_mib)
    result = plan(spec, pools=[tight], catalog=CATALOG)
    expected = best_objective(spec, [tight], catalog=CATALOG)
    assert expected is not None and result.chosen is not None
    assert result.chosen.total_cost == pytest.approx(expected, rel=1e-9)


def test_same_inputs_same_plan_whatever_the_pool_order() -> None:
    spec = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).build()
    pools = [make_pool(p, p, per_node=4) for p in PRODUCTS]
    first = plan(spec, pools=pools, catalog=CATALOG)
    again = plan(spec, pools=list(reversed(pools)), catalog=CATALOG)
    assert first.plan == again.plan
    assert [a.describe() for a in first.alternatives] == [a.describe() for a in again.alternatives]
    assert first.rejections == again.rejections


def test_ties_break_on_pool_name() -> None:
    spec = make_job().build()
    twins = [make_pool("b-pool", "l4"), make_pool("a-pool", "l4")]
    assert plan(spec, pools=twins, catalog=CATALOG).plan.node_pool == "a-pool"  # type: ignore[union-attr]


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(specs_and_pools(), st.integers(0, 2))
def test_ranking_with_cutoffs_equals_solving_every_pool(
    case: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]], alternatives: int
) -> None:
    spec, few = case
    pools = few + [make_pool(f"cat-{p}", p, per_node=2, max_nodes=2) for p in PRODUCTS]
    result = plan(spec, pools=pools, max_alternatives=alternatives, catalog=CATALOG)
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    ctx = search_context(spec, shape)
    choices, _ = strategy_choices(spec.strategy)
    offers, _ = resolve_offers(pools, catalog=CATALOG)
    bests = [b for o in offers if (b := best_on_offer(ctx, o, choices).best) is not None]
    ranked = sorted(bests, key=lambda c: (*objective_key(c, spec.objective.minimize), c.pool))
    got = [c for c in (result.chosen, *result.alternatives) if c is not None]
    assert [(c.pool, c.total_cost) for c in got] == [(c.pool, c.total_cost) for c in ranked[: 1 + alternatives]]
    assert {r.pool for r in result.rejections} == {o.pool for o in offers} - {c.pool for c in bests}


# A search context is shared by later plans of the same job (planner.plan_job.CONTEXTS): what it caches
# must hold on any pools, so a context warmed on other pools plans exactly as a fresh one.
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(varied_specs_and_pools(), varied_specs_and_pools())
def test_a_context_warmed_on_other_pools_plans_like_a_fresh_one(
    case: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]],
    other: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]],
) -> None:
    from memfit.planner import plan_job

    spec, pools = case
    plan_job.CONTEXTS.clear()
    fresh = plan(spec, pools=pools, catalog=CATALOG)
    plan(spec, pools=other[1], catalog=CATALOG)  # the same job's context, warmed on other pools
    plan(spec, pools=[*other[1], *pools[:1]], catalog=CATALOG)
    warm = plan(spec, pools=pools, catalog=CATALOG)
    assert warm.plan == fresh.plan
    assert [a.describe() for a in warm.alternatives] == [a.describe() for a in fresh.alternatives]
    assert warm.rejections == fresh.rejections


def test_tie_tiers_are_transitive_and_follow_the_objective() -> None:
    values = sorted([0.5, 0.999, 1.0, 1.004, 1.009, 1.0101, 1.02, 3.0, 1e-7, 1e6])
    tiers = [tier(v) for v in values]
    assert tiers == sorted(tiers)  # never decreasing: a lower bound on an objective bounds its tier
    assert tier(1.0) == tier(1.0 + TIE_TOLERANCE / 2) < tier((1.0 + TIE_TOLERANCE) ** 2)
    assert tier(0.0) < tier(1e-300) and tier(float("inf")) == float("inf")


def test_a_launch_bound_job_takes_the_simplest_of_plans_that_tie() -> None:
    """A tiny model's step is kernel launches: every engine costs within 1% of the others, so the plan
    is plain DDP rather than FSDP a fraction of a percent cheaper (less fp16 weight-cast traffic)."""
    def job(**pins: str) -> MemoryOptimizedTrainingJobSpec:
        return make_job().gpt(layers=2, hidden=64, heads=4, vocab=512, sequenceLength=64).batch(8).pin(
            precision="fp16", **pins).build()

    pools = [make_pool("t4", "t4", per_node=1, max_nodes=1)]
    chosen = plan(job(), pools=pools, catalog=CATALOG).chosen
    assert chosen is not None and chosen.strategy.config.engine == Engine.DDP
    fsdp = plan(job(engine="fsdp"), pools=pools, catalog=CATALOG).chosen
    assert fsdp is not None and chosen.total_cost / (1 + TIE_TOLERANCE) < fsdp.total_cost < chosen.total_cost


def _evaluate_every_member(ctx, prepared):  # type: ignore[no-untyped-def]
    """The any-fit check as it was first written: every member of every group, leanest first."""
    from memfit.planner.search import _evaluate

    for _, _, _, layout, _, members in sorted(prepared.bounds, key=lambda item: -item[3].world_size):
        for choice in sorted(members, key=lambda c: (ctx.min_peak(c, layout), c.rank)):
            if _evaluate(ctx, prepared.offer, layout, choice, prepared.failures, None)[0] is not None:
                return True
    return False


def _noted(failures):  # type: ignore[no-untyped-def]
    def entry(e):  # type: ignore[no-untyped-def]
        return None if e is None else (e[0], e[1].rank, *e[2:])

    return (entry(failures.min_memory), entry(failures.min_memory_on_gpu), entry(failures.min_host),
            entry(failures.min_nvme), entry(failures.min_deadline), failures.interrupted_world_size)


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(specs_and_pools())
def test_any_fit_notes_what_evaluating_every_member_notes(case: tuple[MemoryOptimizedTrainingJobSpec, list[GPUNodePool]]) -> None:
    """A pool that cannot rank is only checked for any fit; the check stops at a group's first member out
    of memory and skips groups an earlier pool showed too large, and still finds the same answer and
    explains the pool with the same failures as evaluating every member (pools in turn, as a plan goes)."""
    from memfit.planner.search import any_fit, prepare_offer

    spec, few = case
    # Two small pools in a row: the second meets groups the first showed too large.
    pools = [*few, make_pool("small", "t4", per_node=1, memory_mib=900, max_nodes=2),
             make_pool("smaller", "t4", per_node=1, memory_mib=600, max_nodes=2),
             *(make_pool(f"cat-{p}", p, per_node=2, max_nodes=2) for p in PRODUCTS)]
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    reference_ctx, ctx = search_context(spec, shape), search_context(spec, shape)
    choices, _ = strategy_choices(spec.strategy)
    offers, _ = resolve_offers(pools, catalog=CATALOG)
    for offer in offers:
        reference = prepare_offer(reference_ctx, offer, choices)
        prepared = prepare_offer(ctx, offer, choices)
        assert any_fit(ctx, prepared) == _evaluate_every_member(reference_ctx, reference), offer.pool
        assert _noted(prepared.failures) == _noted(reference.failures), offer.pool
        best_on_offer(ctx, offer, choices)  # what a plan's search leaves in the context for the next pool
        best_on_offer(reference_ctx, offer, choices)


def test_chunked_loss_is_only_evaluated_where_the_unchunked_choice_does_not_fit_the_whole_batch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The chunked loss runs the same step with more head compute and loses ties, so where its unchunked
    # twin fits the whole per-GPU batch (the search's largest micro-batch) it cannot win: not evaluated.
    evaluated: list[tuple[bool, int, int]] = []
    real = search._evaluate

    def counting(ctx, offer, layout, choice, failures, best_key, **kw):  # type: ignore[no-untyped-def]
        found = real(ctx, offer, layout, choice, failures, best_key, **kw)
        batch = found[0].strategy.config.micro_batch_size if found[0] is not None else 0
        evaluated.append((choice.config.chunked_loss, choice.rank, batch))
        return found

    monkeypatch.setattr(search, "_evaluate", counting)
    roomy = make_pool("roomy", "h100-80", per_node=1, max_nodes=1)
    result = plan(make_job().batch(8).build(), pools=[roomy], catalog=CATALOG)
    assert result.chosen is not None and not result.chosen.strategy.config.chunked_loss
    unchunked_whole = [rank for chunked, rank, batch in evaluated if not chunked and batch == 8]
    assert unchunked_whole, "the unchunked choices fit the whole batch on an 80 GB GPU"
    assert not [rank for chunked, rank, _ in evaluated if chunked and rank - 1 in unchunked_whole]
    # Where memory is tight the chunked loss is still searched (and the plan equals the exhaustive one).
    evaluated.clear()
    tight = make_pool("tight", "t4", per_node=1, max_nodes=1, memory_mib=1200)
    _assert_equals_exhaustive(make_job().gpt(vocab=32000, sequenceLength=512).batch(8).build(), [tight])
    assert any(chunked for chunked, _, _ in evaluated)

"""LoRA/QLoRA as planning dimensions: chosen only when allowed, compared with the full fine-tune."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfit.api.common import Engine, PeftMethod
from memfit.catalog import CATALOG
from memfit.planner import catalog_pools, plan
from memfit.planner.reference import best_objective
from planner_factories import LLAMA_1B_CONFIG, LLAMA_70B_CONFIG, make_job, make_pool

METHODS = ["none", "lora", "qlora"]


@given(
    allowed=st.lists(st.sampled_from(METHODS), min_size=1, max_size=3, unique=True),
    auto=st.booleans(),
    products=st.lists(st.sampled_from(["t4", "l4", "a10g", "a100-40", "h100-80"]), min_size=1, max_size=3),
    memory_mib=st.sampled_from([None, 300, 600, 2000]),
    batch=st.sampled_from([4, 8, 16]),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_method_the_user_did_not_allow_is_never_chosen(
    allowed: list[str], auto: bool, products: list[str], memory_mib: int | None, batch: int
) -> None:
    method = "auto" if auto or len(allowed) > 1 else allowed[0]
    job = make_job().gpt(layers=4, hidden=256, heads=4).batch(batch)
    job = (job.peft("auto", *allowed) if method == "auto" else job.peft(method)).build()
    pools = [make_pool(f"p{i}", product, memory_mib=memory_mib, per_node=2) for i, product in enumerate(products)]
    result = plan(job, pools=pools, catalog=CATALOG)
    permitted = {PeftMethod(m) for m in (allowed if method == "auto" else [method])}
    for candidate in ([result.chosen] if result.chosen else []) + list(result.alternatives):
        assert candidate.strategy.config.peft in permitted
    if result.plan is not None:
        assert result.plan.peft in permitted
        assert (result.plan.adapter is None) == (result.plan.peft == PeftMethod.NONE)


def test_the_default_job_never_plans_lora_even_where_only_lora_would_fit() -> None:
    tight = make_pool("tight", "l4", memory_mib=3000)  # Llama-1B: a full fine-tune needs far more
    job = make_job().hf(LLAMA_1B_CONFIG, seq=256).batch(4)
    assert plan(job.build(), pools=[tight], catalog=CATALOG).plan is None
    allowed = plan(job.peft("auto", "none", "qlora").build(), pools=[tight], catalog=CATALOG)
    assert allowed.plan is not None and allowed.plan.peft == PeftMethod.QLORA


@pytest.mark.parametrize("allowed", [("none", "lora"), ("lora", "qlora"), ("none", "lora", "qlora")])
def test_the_planner_agrees_with_brute_force_when_peft_is_allowed(allowed: tuple[str, ...]) -> None:
    job = make_job().gpt(layers=4, hidden=256, heads=4, vocab=1000).batch(8).peft("auto", *allowed).build()
    pools = [make_pool("small", "t4", memory_mib=400), make_pool("big", "l4", per_node=2, memory_mib=2500)]
    result = plan(job, pools=pools, catalog=CATALOG)
    expected = best_objective(job, pools, catalog=CATALOG)
    assert result.chosen is not None and expected is not None
    assert result.chosen.total_cost == pytest.approx(expected, rel=1e-9)


def test_llama_70b_qlora_fits_one_80gb_gpu_and_says_why_smaller_ones_do_not() -> None:
    # engine ddp: one unsharded GPU is the question (QLoRA on FSDP may shard it over smaller GPUs)
    job = make_job().hf(LLAMA_70B_CONFIG, seq=2048).batch(16).steps(500).peft("qlora").pin(
        activationCheckpointing="full", engine="ddp").build()
    pools = [make_pool("l4", "l4", per_node=8), make_pool("l40s", "l40s", per_node=8),
             make_pool("a100-80", "a100-80", per_node=8)]
    result = plan(job, pools=pools, catalog=CATALOG, max_alternatives=0)
    assert result.plan is not None
    # DDP keeps the whole 4-bit model on every GPU (more GPUs only when they cost no more: planner ties).
    assert (result.plan.node_pool, result.plan.engine, result.plan.peft) == ("a100-80", Engine.DDP, PeftMethod.QLORA)
    peak = result.plan.memory.peak_bytes * (1 + result.plan.headroom_percent / 100)
    assert peak <= result.plan.gpu_memory_bytes
    rejected = {r.pool: r.reason for r in result.rejections}
    assert "needs" in rejected["l4"] and "QLoRA" in rejected["l4"]
    assert result.plan.trainable_fraction is not None and result.plan.trainable_fraction < 0.01
    assert result.plan.full_finetune is not None


def test_a_lora_plan_reports_the_full_fine_tune_it_beats() -> None:
    job = make_job().hf(LLAMA_1B_CONFIG, seq=512).batch(8).peft("auto", "none", "lora").build()
    result = plan(job, pools=catalog_pools(CATALOG), catalog=CATALOG)
    assert result.plan is not None and result.plan.peft == PeftMethod.LORA
    full = result.plan.full_finetune
    assert full is not None and full.estimated_cost is not None and full.peak_bytes is not None
    assert result.plan.estimated_cost < full.estimated_cost
    # 16 layers x rank 16 x (q, o: 2048 + 2048; k, v: 2048 + 512; gate, up, down: 2048 + 8192)
    assert result.plan.trainable_parameters == 16 * 16 * (2 * 4096 + 2 * 2560 + 3 * 10240)


@given(
    allowed=st.lists(st.sampled_from(METHODS), min_size=1, max_size=3, unique=True),
    layers=st.integers(2, 8),
    hidden=st.sampled_from([128, 256, 512]),
    batch=st.sampled_from([4, 8, 16]),
    products=st.lists(st.sampled_from(["t4", "l4", "a100-40", "h100-80"]), min_size=1, max_size=2),
    memory_mib=st.sampled_from([200, 400, 800, 3000]),
    minimize=st.sampled_from(["cost", "time"]),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_with_peft_allowed_the_planner_finds_the_brute_force_optimum(
    allowed: list[str], layers: int, hidden: int, batch: int, products: list[str], memory_mib: int, minimize: str
) -> None:
    job = (make_job().gpt(layers=layers, hidden=hidden, heads=4, vocab=2000, sequenceLength=256).batch(batch)
           .peft("auto", *allowed).objective(minimize=minimize).build())
    pools = [make_pool(f"p{i}", product, per_node=2, memory_mib=memory_mib) for i, product in enumerate(products)]
    result = plan(job, pools=pools, catalog=CATALOG)
    expected = best_objective(job, pools, catalog=CATALOG)
    if expected is None:
        assert result.chosen is None
        return
    assert result.chosen is not None
    got = result.chosen.hours if minimize == "time" else result.chosen.total_cost
    assert got == pytest.approx(expected, rel=1e-9)


def test_a_peft_plan_after_another_pools_plan_is_still_the_brute_force_optimum() -> None:
    """The plan's search context is shared by later plans of the same job; the full fine-tune it is compared
    with searches another list of choices, whose ranks must not meet the plan's caches (they did: a QLoRA
    plan on an L4 after one on a T4 came out faster than any configuration can run)."""
    job = (make_job().gpt(layers=4, hidden=128, heads=4, vocab=2000, sequenceLength=256).batch(4)
           .peft("auto", "qlora").objective(minimize="time").build())
    for product in ("t4", "l4", "a100-40"):
        pools = [make_pool("p0", product, per_node=2, memory_mib=3000)]
        result = plan(job, pools=pools, catalog=CATALOG)
        assert result.chosen is not None
        assert result.chosen.hours == pytest.approx(best_objective(job, pools, catalog=CATALOG), rel=1e-9)


def test_peft_runs_where_the_engine_holds_it_lora_on_zero3_and_qlora_on_fsdp() -> None:
    from memfit.api.common import Engine, Offload
    from memfit.planner.space import strategy_choices

    job = make_job().peft("auto", "lora", "qlora").build()
    choices, _ = strategy_choices(job.strategy)
    configs = {(c.config.peft, c.config.engine, c.config.zero_stage, c.config.offload) for c in choices}
    engines = {(m, e) for m, e, _, _ in configs}
    assert {(PeftMethod.LORA, Engine.FSDP), (PeftMethod.QLORA, Engine.FSDP), (PeftMethod.LORA, Engine.DEEPSPEED)} <= engines
    assert (PeftMethod.QLORA, Engine.DEEPSPEED) not in engines
    assert {z for m, e, z, _ in configs if m == PeftMethod.LORA and e == Engine.DEEPSPEED} == {3}
    offloaded = {(m, e, z, o) for m, e, z, o in configs if m != PeftMethod.NONE and o != Offload.NONE}
    assert offloaded == {(PeftMethod.LORA, Engine.DEEPSPEED, 3, Offload.CPU)}

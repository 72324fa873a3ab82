"""`plan`: pins, limits, headroom, NoFit reasons, baselines and the Plan contract."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import StrategySpec
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.planner import catalog_pools, plan, resolve_offers, resolve_shape, search_context
from memfit.planner.baseline import cheapest_plain_baseline
from memfit.planner.practitioner import rule_bytes
from planner_factories import GIB, LLAMA_1B_CONFIG, LLAMA_7B_CONFIG, make_job, make_pool

L4 = make_pool("l4", "l4")
T4 = make_pool("t4", "t4")
A100 = make_pool("a100-80", "a100-80", per_node=8)
H100 = make_pool("h100-80", "h100-80", per_node=8)


def test_plan_is_filled_and_fits_with_headroom() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).steps(2000).headroom(10).build()
    result = plan(spec, pools=[L4, A100, H100], catalog=CATALOG)
    p = result.plan
    assert isinstance(p, Plan)
    assert p.memory.peak_bytes * 1.10 <= p.gpu_memory_bytes
    assert p.micro_batch_size * p.gradient_accumulation_steps * p.world_size == 64
    assert p.estimated_cost == pytest.approx(p.price_per_hour * p.estimated_hours, rel=1e-5)  # both rounded
    # On-demand, interval left to memfit: 500 steps or more, so the writes add at most 1 % of the run, or
    # the one final write where a single write takes longer than that (here: one interval, the whole run).
    work = p.step_seconds * 2000 / 3600
    assert p.checkpoint_every_steps is not None and p.checkpoint_every_steps >= 500
    assert work * (1 - 1e-4) <= p.estimated_hours <= work * 1.02
    assert p.problem == spec.problem and p.training == spec.training
    assert Plan.model_validate_json(p.model_dump_json()) == p


@pytest.mark.parametrize("headroom", [0, 10, 30, 60])
def test_headroom_is_respected(headroom: int) -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(32).headroom(headroom).build()
    result = plan(spec, pools=[L4, make_pool("a10g", "a10g")], catalog=CATALOG)
    assert result.chosen is not None
    for c in (result.chosen, *result.alternatives):
        assert c.memory.peak_bytes * (1 + headroom / 100) <= c.usable_bytes


def test_bf16_pinned_on_t4_is_no_fit_with_a_reason() -> None:
    spec = make_job().pin(precision="bf16").build()
    result = plan(spec, pools=[T4], catalog=CATALOG)
    assert result.plan is None
    assert "Tesla-T4 has no bf16" in result.rejections[0].reason


def test_t4_trains_in_fp16_when_precision_is_auto() -> None:
    result = plan(make_job().build(), pools=[T4], catalog=CATALOG)
    assert result.plan is not None and result.plan.precision in (Precision.FP16, Precision.FP32)


def test_nvme_offload_pinned_on_a_pool_without_nvme_is_rejected() -> None:
    spec = make_job().pin(offload="nvme").build()
    result = plan(spec, pools=[make_pool("no-nvme", "l4", nvme_gib=0)], catalog=CATALOG)
    assert result.plan is None
    assert "NVMe offload needs local NVMe; the pool has none" in result.rejections[0].reason


def test_impossible_pins_are_no_fit_never_an_exception() -> None:
    base = make_job().build()
    # Admission rejects DDP + ZeRO-3; an object built around validation still must not crash the planner.
    pins = StrategySpec.model_construct(engine=Engine.DDP, precision=Precision.AUTO,
                                        activation_checkpointing=Checkpointing.AUTO, zero_stage=3,
                                        offload=Offload.AUTO, optimizer8bit="auto", micro_batch_size="auto")
    spec = base.model_copy(update={"strategy": pins})
    result = plan(spec, pools=[L4], catalog=CATALOG)
    assert result.plan is None
    assert result.reasons == ("the pinned strategy cannot run: DDP does not shard: ZeRO stage 3 needs fsdp or deepspeed",)


def test_pins_are_honoured() -> None:
    spec = (make_job().hf(LLAMA_1B_CONFIG).batch(32)
            .pin(engine="fsdp", zeroStage=3, precision="bf16", activationCheckpointing="full",
                 optimizer8bit="disabled", microBatchSize=2).build())
    p = plan(spec, pools=[L4, A100], catalog=CATALOG).plan
    assert p is not None
    assert (p.engine, p.zero_stage, p.precision, p.activation_checkpointing, p.optimizer8bit,
            p.micro_batch_size) == (Engine.FSDP, 3, Precision.BF16, Checkpointing.FULL, False, 2)


def test_too_big_for_every_pool_explains_each_pool() -> None:
    spec = make_job().hf(LLAMA_7B_CONFIG, seq=4096).batch(8).max_nodes(1).build()
    small = make_pool("l4-spot", "l4", price=0.35, host_gib=16, nvme_gib=0)
    result = plan(spec, pools=[small, make_pool("t4-spot", "t4", price=0.2, host_gib=16, nvme_gib=0)], catalog=CATALOG)
    assert result.plan is None
    reasons = {r.pool: r.reason for r in result.rejections}
    gpu, host = reasons["l4-spot"].split(". ")
    # Without offload even the leanest configuration (fp32 weights, 8-bit state, the optimizer step in
    # backward so no gradients are kept: 6 B/param, the whole batch at once) needs far more than an L4 has.
    assert gpu == ("without offload it needs 77.5 GiB per GPU (70.5 GiB predicted + 10% headroom) at micro-batch 8 "
                   "even with DDP, bf16, full checkpointing, 8-bit optimizer, optimizer step in backward, chunked loss "
                   "on 1 GPU; has 22.5 GiB")
    # With CPU offload it would fit the GPU, but a 16 GiB node cannot hold 16 B/param x 1.5 of 6.7B.
    assert host == ("FSDP full shard, bf16, selective-op checkpointing, CPU offload on 1 GPU would fit the GPU memory "
                    "but needs 150.6 GiB host RAM per node; has 14.4 GiB usable")
    # No NVMe sentence: offload is auto, so the configurations without NVMe were searched (above).
    assert reasons["t4-spot"].startswith("without offload it needs ")


def test_max_cost_per_hour_excludes_expensive_layouts() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).objective(maxCostPerHour=2.0).build()
    result = plan(spec, pools=[L4, A100], catalog=CATALOG)
    assert result.chosen is not None and result.chosen.price_per_hour <= 2.0


def test_deadline_pushes_to_faster_configurations_or_no_fit() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).steps(2000)
    cheapest = plan(spec.build(), pools=[L4, H100], catalog=CATALOG).chosen
    assert cheapest is not None
    tight = plan(spec.objective(deadlineHours=cheapest.hours / 2).build(), pools=[L4, H100], catalog=CATALOG).chosen
    assert tight is not None and tight.hours <= cheapest.hours / 2 and tight.pool == "h100-80"
    impossible = plan(spec.objective(deadlineHours=1e-4).build(), pools=[L4, H100], catalog=CATALOG)
    assert impossible.plan is None
    assert all("over the deadline" in r.reason for r in impossible.rejections)


def test_minimize_time_is_never_slower_than_minimize_cost() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64)
    cost = plan(spec.build(), pools=[L4, A100, H100], catalog=CATALOG).chosen
    time = plan(spec.objective(minimize="time").build(), pools=[L4, A100, H100], catalog=CATALOG).chosen
    assert cost is not None and time is not None
    assert time.hours <= cost.hours and time.total_cost >= cost.total_cost


def test_placement_node_pools_filter_and_unknown_names() -> None:
    spec = make_job().pools("l4", "missing").build()
    result = plan(spec, pools=[L4, A100], catalog=CATALOG)
    assert result.plan is not None and result.plan.node_pool == "l4"
    assert [str(r) for r in result.rejections] == [
        "missing: named in placement.nodePools but no such GPUNodePool exists"
    ]


def test_free_gpus_cap_the_layout() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).objective(minimize="time").build()
    result = plan(spec, pools=[A100], free_gpus={"a100-80": 2}, catalog=CATALOG)
    assert result.plan is not None and result.plan.world_size <= 2


def test_entrypoint_without_profile_says_so() -> None:
    result = plan(make_job().entrypoint().build(), pools=[L4], catalog=CATALOG)
    assert result.plan is None and "known only from a profile" in result.reasons[0]


def test_default_baseline_is_the_practitioners_setup() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).build()
    pools = catalog_pools(CATALOG)
    result = plan(spec, pools=pools, catalog=CATALOG)
    base, chosen = result.baseline, result.chosen
    assert base is not None and chosen is not None and base.fits
    # The 20 B/param rule (23 GiB) picks the cheapest GPU per GPU-hour that holds it; plain DDP fits
    # there, on the whole 8-GPU node (64 splits over 8 ranks).
    ctx = search_context(spec, resolve_shape(spec, None))  # type: ignore[arg-type]
    offers, _ = resolve_offers(pools, catalog=CATALOG)
    holders = [o for o in offers if o.usable_bytes >= rule_bytes(ctx, spec.strategy)]
    cheapest = min(holders, key=lambda o: (o.price_per_node_hour / o.gpus_per_node, o.pool))
    assert base.pool == cheapest.pool and base.escalation == ()
    assert base.label == f"plain bf16 DDP on 1x8 {cheapest.product} ({cheapest.pool})"
    assert result.savings_percent == pytest.approx(100 * (1 - chosen.total_cost / base.total_cost))
    # Every rung of the practitioner's ladder is in memfit's search space: memfit never costs more.
    assert chosen.total_cost <= base.total_cost * (1 + 1e-9)
    assert result.declared_baseline is None
    assert result.plan is not None and result.plan.baseline is not None
    assert result.plan.baseline.hours == pytest.approx(base.hours, rel=1e-5)


def test_fp16_plain_baseline_on_a_gpu_without_bf16() -> None:
    result = plan(make_job().build(), pools=[make_pool("t4", "t4")], catalog=CATALOG)
    assert result.baseline is not None and result.baseline.label.startswith("plain fp16 DDP on 1x1 Tesla-T4")


def test_declared_baseline_is_reported_beside_the_default() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).baseline("a100-80").build()
    result = plan(spec, pools=catalog_pools(CATALOG), catalog=CATALOG)
    declared, chosen = result.declared_baseline, result.chosen
    assert declared is not None and chosen is not None
    assert declared.label.startswith("declared: plain bf16 DDP on 1x8 NVIDIA-A100-SXM4-80GB")
    assert declared.price_per_hour == pytest.approx(27.45, rel=0.01)  # a whole 8-GPU node is rented
    assert result.declared_savings_percent == pytest.approx(100 * (1 - chosen.total_cost / declared.total_cost))
    assert result.plan is not None and result.plan.declared_baseline is not None
    summary = result.plan.summary()
    assert summary.declared_baseline == declared.label and summary.declared_savings_percent is not None


def test_practitioner_escalates_where_plain_ddp_fits_no_pool() -> None:
    spec = make_job().hf(LLAMA_1B_CONFIG).batch(64).build()
    result = plan(spec, pools=[make_pool("t4", "t4")], catalog=CATALOG)
    ctx = search_context(spec, resolve_shape(spec, None))  # type: ignore[arg-type]
    offers, _ = resolve_offers([make_pool("t4", "t4")], catalog=CATALOG)
    assert cheapest_plain_baseline(ctx, offers) is None  # plain fp16 DDP does not fit a T4
    base = result.baseline
    assert result.plan is not None and base is not None and base.fits and result.savings_percent is not None
    # The rule's 23 GiB fits no T4, so the practitioner shards at once: over 2 T4s (the rule spread), then
    # checkpointing, then CPU offload.
    assert base.label == "fp16 FSDP full shard + full checkpointing + CPU offload on 2x1 Tesla-T4 (t4)"
    assert [e.split(":")[0] for e in base.escalation] == [
        "fp16 FSDP full shard on 2x1 Tesla-T4 (t4)", "fp16 FSDP full shard + full checkpointing on 2x1 Tesla-T4 (t4)"]
    assert result.plan.summary().savings is not None


def test_no_baseline_when_no_practitioner_setup_fits() -> None:
    # One T4 with 16 GiB of host RAM: only memfit's ZeRO-3 NVMe offload fits a 1B model there.
    pools = [make_pool("t4", "t4", host_gib=16, max_nodes=1)]
    result = plan(make_job().hf(LLAMA_1B_CONFIG).batch(64).max_nodes(1).build(), pools=pools, catalog=CATALOG)
    assert result.plan is not None and result.baseline is None and result.savings_percent is None
    assert "no practitioner setup (DDP, checkpointing, FSDP, CPU offload) fits an allowed pool" in result.message()
    assert result.plan.summary().savings is None


def test_offline_declared_baseline_pool_comes_from_the_catalog() -> None:
    result = plan(make_job().baseline("h100-80", nodes=1).build(), pools=[L4], catalog=CATALOG)
    assert result.declared_baseline is not None and result.declared_baseline.pool == "h100-80"
    assert result.baseline is not None and result.baseline.pool == "l4"


def test_bad_pools_are_rejected_with_reasons_and_the_rest_planned() -> None:
    negative = GPUNodePool.model_validate({"metadata": {"name": "neg"}, "spec": {"gpu": {"product": "l4"}}})
    negative = negative.model_copy(update={"spec": negative.spec.model_copy(update={"price_per_node_hour": -1.0})})
    zero_memory = make_pool("zero", "l4", memory_mib=0)
    result = plan(make_job().build(), pools=[negative, zero_memory, L4], catalog=CATALOG)
    assert result.plan is not None and result.plan.node_pool == "l4"
    reasons = {r.pool: r.reason for r in result.rejections}
    assert "negative" in reasons["neg"] and "memoryMiB is 0" in reasons["zero"]


def test_no_pools_at_all_is_no_fit() -> None:
    result = plan(make_job().build(), pools=[], catalog=CATALOG)
    assert result.plan is None and result.reasons == ("no GPUNodePools to plan on",)


def test_memory_is_within_gpu_capacity_for_every_candidate_on_the_catalog() -> None:
    spec = make_job().hf(LLAMA_7B_CONFIG, seq=4096).batch(64).max_nodes(4).build()
    result = plan(spec, pools=catalog_pools(CATALOG), catalog=CATALOG)
    assert result.chosen is not None
    for c in (result.chosen, *result.alternatives):
        assert c.memory.peak_bytes * 1.1 <= c.usable_bytes
        assert c.memory.peak_bytes > 4 * GIB

"""Offers: catalog defaults, rejections with reasons, layouts and their prices."""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest
from memfit.api.common import Precision
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG, GpuCatalog
from memfit.planner import catalog_pools, plan, resolve_offers
from memfit.planner import offers as offers_module
from memfit.planner.offers import Offer, PoolRejection, resolve_offer
from planner_factories import GIB, make_job, make_pool
from pydantic import ValidationError


def _with_spec(pool: GPUNodePool, **changes: object) -> GPUNodePool:
    """A pool with spec fields set past validation (what a buggy client could still hand over)."""
    return pool.model_copy(update={"spec": pool.spec.model_copy(update=changes)})


def test_known_product_gets_catalog_memory_price_bf16_and_host() -> None:
    offer = resolve_offer(make_pool("l4", "NVIDIA-L4", per_node=4, price=None), catalog=CATALOG)
    assert isinstance(offer, Offer)
    assert offer.usable_bytes == 23034 * 1024**2
    assert offer.price_per_node_hour == pytest.approx(4 * 0.805)
    assert offer.supports_bf16 and offer.speed.bf16_tflops == 121.0
    assert offer.host_bytes_per_node == 16 * 4 * GIB and offer.nvme_bytes_per_node == 250 * 4 * GIB
    assert offer.speed.intra_node_gbps == 25.0  # PCIe


def test_t4_has_no_bf16() -> None:
    offer = resolve_offer(make_pool("t4", "Tesla-T4"), catalog=CATALOG)
    assert isinstance(offer, Offer) and not offer.supports_bf16


def test_pool_overrides_win_over_the_catalog() -> None:
    offer = resolve_offer(make_pool("x", "a100-80", memory_mib=40000, price=1.5, host_gib=64, nvme_gib=0,
                                    bf16_tflops=156), catalog=CATALOG)
    assert isinstance(offer, Offer)
    assert (offer.usable_bytes, offer.price_per_node_hour) == (40000 * 1024**2, 1.5)
    assert offer.speed.bf16_tflops == 156 and offer.speed.fp32_tflops == pytest.approx(19.5 / 2)


def test_unknown_product_with_memory_and_price_is_usable_with_a_note() -> None:
    offer = resolve_offer(make_pool("mystery", "ACME-X1", memory_mib=30000, price=2.0), catalog=CATALOG)
    assert isinstance(offer, Offer)
    assert offer.notes and "throughput unknown" in offer.notes[0]
    assert offer.host_bytes_per_node is None  # no CPU offload without a host size


REJECTED = {
    "unknown product without memory": (
        make_pool("u", "ACME-X1", price=1.0), "not in the built-in catalog and gpu.memoryMiB is not set"),
    "unknown product without price": (make_pool("u", "ACME-X1", memory_mib=1000), "no price"),
    "zero memory": (make_pool("z", "l4", memory_mib=0), "gpu.memoryMiB is 0"),
    "zero price": (make_pool("p", "l4", price=0.0), "pricePerNodeHour is 0"),
    "negative price": (_with_spec(make_pool("n", "l4"), price_per_node_hour=-2.0), "pricePerNodeHour is negative"),
    "no nodes": (make_pool("m", "l4", max_nodes=0), "maxNodes is 0"),
}


@pytest.mark.parametrize(("pool", "reason"), REJECTED.values(), ids=REJECTED.keys())
def test_bad_pools_are_rejections_not_exceptions(pool: GPUNodePool, reason: str) -> None:
    rejected = resolve_offer(pool, catalog=CATALOG)
    assert isinstance(rejected, PoolRejection)
    assert reason in rejected.reason


def test_no_free_gpus_rejects_and_some_free_gpus_cap_layouts() -> None:
    pool = make_pool("a100", "a100-80", per_node=8, max_nodes=4)
    assert isinstance(resolve_offer(pool, free_gpus=0, catalog=CATALOG), PoolRejection)
    offer = resolve_offer(pool, free_gpus=4, catalog=CATALOG)
    assert isinstance(offer, Offer)
    assert [lay.world_size for lay in offer.layouts()] == [1, 2, 4]


def test_layouts_are_partial_nodes_then_whole_nodes_priced_pro_rata() -> None:
    offer = resolve_offer(make_pool("h", "h100-80", per_node=8, price=80.0, max_nodes=3), catalog=CATALOG)
    assert isinstance(offer, Offer)
    layouts = [(lay.nodes, lay.gpus_per_node, lay.price_per_hour) for lay in offer.layouts()]
    assert layouts == [(1, 1, 10.0), (1, 2, 20.0), (1, 4, 40.0), (1, 8, 80.0), (2, 8, 160.0), (3, 8, 240.0)]
    assert [lay.world_size for lay in offer.layouts(max_nodes=1)] == [1, 2, 4, 8]


def test_resolve_offers_sorts_and_filters() -> None:
    pools = [make_pool("b", "l4"), make_pool("a", "t4"), make_pool("c", "l4", memory_mib=0)]
    offers, rejections = resolve_offers(pools, allowed=["a", "c", "ghost"], catalog=CATALOG)
    assert [o.pool for o in offers] == ["a"]
    assert [r.pool for r in rejections] == ["ghost", "c"]


def test_catalog_pools_are_one_per_gpu_with_8_gpus_per_node() -> None:
    pools = catalog_pools(CATALOG)
    assert [p.metadata.name for p in pools] == ["t4", "l4", "a10g", "v100-16", "v100-32", "l40s",
                                                     "a100-40", "a100-80", "h100-pcie", "h100-80", "h200", "b200"]
    assert {p.spec.gpu.per_node for p in pools} == {8}
    offers, rejections = resolve_offers(pools, catalog=CATALOG)
    assert len(offers) == len(CATALOG) and rejections == []


def test_the_planner_reads_the_catalog_it_is_given() -> None:
    """Catalog defaults come from the `catalog` argument, never from the built-in module global."""
    l4 = CATALOG.find("l4")
    assert l4 is not None
    acme = replace(l4, key="acme", product="ACME-X1", usable_mib=30000, price_per_gpu_hour=0.5, aliases=())
    pool = make_pool("acme", "ACME-X1", per_node=4, price=None)
    assert isinstance(resolve_offer(pool, catalog=CATALOG), PoolRejection)  # unknown to the built-in one
    offer = resolve_offer(pool, catalog=GpuCatalog((acme,)))
    assert isinstance(offer, Offer)
    assert (offer.usable_bytes, offer.price_per_node_hour) == (30000 * 1024**2, 4 * 0.5)
    assert [p.metadata.name for p in catalog_pools(GpuCatalog((acme,)))] == ["acme"]
    # No planner module imports the built-in catalog (only the types of memfit.catalog).
    planner_dir = Path(offers_module.__file__).parent
    for source in planner_dir.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "memfit.catalog":
                assert {a.name for a in node.names} <= {"GpuCatalog", "GPUModel"}, source.name


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        ({"whole_nodes": 3}, [(1, 1), (1, 2), (1, 4), (2, 4), (3, 4)]),
        ({"whole_nodes": 3, "max_gpus": 4}, [(1, 1), (1, 2), (1, 4)]),
        ({"whole_nodes": 0, "on_shared_nodes": (2,), "max_gpus": 1}, [(1, 1)]),
    ],
    ids=["free nodes only", "queue quota 4 GPUs caps whole nodes", "quota 1 on a shared node"],
)
def test_free_gpus_max_gpus_caps_layouts(free: dict[str, object], expected: list[tuple[int, int]]) -> None:
    """FreeGpus.max_gpus (a Kueue queue's free quota) caps a plan's GPUs on top of the free nodes."""
    from memfit.planner.offers import FreeGpus

    offer = resolve_offer(make_pool("l4", "NVIDIA-L4", per_node=4), catalog=CATALOG,
                          free_gpus=FreeGpus(**free))  # type: ignore[arg-type]
    assert isinstance(offer, Offer)
    assert [(layout.nodes, layout.gpus_per_node) for layout in offer.layouts()] == expected


def test_free_gpus_with_zero_quota_rejects_the_pool() -> None:
    from memfit.planner.offers import FreeGpus

    rejected = resolve_offer(make_pool("l4", "NVIDIA-L4", per_node=4), catalog=CATALOG,
                             free_gpus=FreeGpus(whole_nodes=2, max_gpus=0))
    assert isinstance(rejected, PoolRejection) and rejected.reason == "no free GPUs right now"


# ------------------------------------------------------------------------------------------ impossible rates


@pytest.mark.parametrize("field,value", [("bf16TFLOPS", -1.0), ("memoryBandwidthGBps", 0.0),
                                         ("memoryBandwidthGBps", -5.0)])
def test_an_impossible_gpu_rate_is_refused_naming_the_field(field: str, value: float) -> None:
    body = {"metadata": {"name": "bad"}, "spec": {"gpu": {"product": "l4", field: value}, "pricePerNodeHour": 1.0}}
    with pytest.raises(ValidationError) as caught:
        GPUNodePool.model_validate(body)
    assert field in str(caught.value)


@pytest.mark.parametrize("field,value", [("pricePerNodeHour", -1.0), ("spec.interconnect.interNodeGbps", 0.0)])
def test_an_impossible_price_or_network_is_refused_naming_the_field(field: str, value: float) -> None:
    spec: dict[str, object] = {"gpu": {"product": "l4"}, "pricePerNodeHour": 1.0}
    if field == "pricePerNodeHour":
        spec["pricePerNodeHour"] = value
    else:
        spec["interconnect"] = {"interNodeGbps": value}
    with pytest.raises(ValidationError) as caught:
        GPUNodePool.model_validate({"metadata": {"name": "bad"}, "spec": spec})
    assert field.split(".")[-1] in str(caught.value)


def test_a_zero_price_is_rejected_with_a_reason_not_planned_for_free() -> None:
    rejected = resolve_offer(make_pool("free", "l4", price=0.0), catalog=CATALOG)
    assert isinstance(rejected, PoolRejection) and "pricePerNodeHour is 0" in rejected.reason


def test_no_bf16_on_a_known_gpu_keeps_its_fp16_and_fp32_rates() -> None:
    offer = resolve_offer(make_pool("l4-nobf16", "l4", bf16_tflops=0.0), catalog=CATALOG)
    assert isinstance(offer, Offer)
    assert not offer.supports_bf16 and offer.speed.peak_flops(Precision.BF16) == 0
    assert offer.speed.peak_flops(Precision.FP16) == 121e12 and offer.speed.peak_flops(Precision.FP32) > 0


def test_extreme_but_valid_rates_give_a_finite_non_negative_cost_or_no_fit_never_nan() -> None:
    job = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32).steps(100).build()
    pools = [make_pool("slow", "mystery-gpu", memory_mib=24576, price=1e-6, bf16_tflops=1e-3,
                       gpu_extra={"memoryBandwidthGBps": 1e-3}),
             make_pool("unknown", "mystery-gpu", memory_mib=24576, price=2.0)]
    result = plan(job, pools=pools, catalog=CATALOG)
    for candidate in (*((result.chosen,) if result.chosen else ()), *result.alternatives):
        assert math.isfinite(candidate.total_cost) and candidate.total_cost >= 0
    if result.plan is not None:
        assert math.isfinite(result.plan.estimated_cost) and result.plan.estimated_cost >= 0
    assert any("memory bandwidth unknown" in n for n in result.notes)

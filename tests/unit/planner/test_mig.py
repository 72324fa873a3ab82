"""MIG slices as capacity: a MIG pool's slice as the planner sees it, the plans it wins and loses,
the resource its pods request and how its free slices are counted."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.kube.train_job import build_training_job
from memfit.lifecycle.capacity import observe_pools
from memfit.lifecycle.profiling import placement_of
from memfit.mig import profiles, resolve_slice
from memfit.planner import plan
from memfit.planner.offers import Offer, PoolRejection, resolve_offer
from planner_factories import make_job, make_pool
from pydantic import ValidationError

H100 = "NVIDIA-H100-80GB-HBM3"
H100_PRICE = 6.88  # the catalog's $/GPU-hour


def mig_pool(name: str, profile: str, *, per_node: int = 1, max_nodes: int = 4, **mig: Any) -> GPUNodePool:
    return make_pool(name, H100, per_node=per_node, price=H100_PRICE * per_node, max_nodes=max_nodes,
                     gpu_extra={"mig": {"profile": profile, **mig}}, nodeSelector={"memfit.dev/pool": "h100"})


def whole_pool() -> GPUNodePool:
    return make_pool("h100-whole", H100, per_node=1, price=H100_PRICE, nodeSelector={"memfit.dev/pool": "h100"})


def test_the_catalog_knows_the_profiles_of_mig_gpus_and_none_of_the_others() -> None:
    h100 = {p.name: p for p in profiles(CATALOG.find("h100-80"))}
    assert list(h100) == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    one = h100["1g.10gb"]
    assert (one.compute_fraction, one.memory_fraction, one.max_per_gpu) == (Fraction(1, 7), Fraction(1, 8), 7)
    assert (h100["3g.40gb"].compute_fraction, h100["3g.40gb"].max_per_gpu) == (Fraction(3, 7), 2)
    assert next(p.name for p in profiles(CATALOG.find("a100-40"))) == "1g.5gb"
    for gpu in ("t4", "l4", "a10g", "l40s", "v100-32"):
        assert profiles(CATALOG.find(gpu)) == ()


def test_a_slice_offer_has_its_share_of_memory_compute_bandwidth_and_price() -> None:
    offer = resolve_offer(mig_pool("h100-1g", "1g.10gb", per_node=2), catalog=CATALOG)
    assert isinstance(offer, Offer)
    h100 = CATALOG.find("h100-80")
    assert h100 is not None
    assert offer.usable_bytes == (h100.usable_mib // 8) * 2**20
    assert offer.gpus_per_node == 14  # 2 GPUs x 7 slices
    assert offer.gpu_resource == "nvidia.com/mig-1g.10gb"
    assert offer.product == f"{h100.product}-MIG-1g.10gb"
    assert offer.speed.bf16_tflops == pytest.approx(h100.bf16_tflops / 7)
    assert offer.speed.hbm_gbps == pytest.approx(h100.hbm_gbps / 8)
    assert offer.speed.sm_count == round(h100.sm_count / 7)
    # One slice, one process: never more than one device per plan, priced as one slice of the node.
    assert [(lay.nodes, lay.gpus_per_node) for lay in offer.layouts()] == [(1, 1)]
    assert offer.layouts()[0].price_per_hour == pytest.approx(H100_PRICE / 7)


def test_a_pool_may_describe_a_profile_the_catalog_does_not_know() -> None:
    pool = make_pool("acme-mig", "ACME-X1", per_node=1, price=4.0, memory_mib=12000,
                     gpu_extra={"mig": {"profile": "2g.24gb", "perGPU": 2, "computeFraction": 0.5}})
    offer = resolve_offer(pool, catalog=CATALOG)
    assert isinstance(offer, Offer)
    assert (offer.usable_bytes, offer.gpus_per_node, offer.gpu_resource) == (12000 * 2**20, 2, "nvidia.com/mig-2g.24gb")


@pytest.mark.parametrize(
    ("pool", "field", "words"),
    [
        (mig_pool("x", "2g.10gb"), "gpu.mig.profile", "1g.10gb, 1g.20gb"),
        (make_pool("x", "l4", gpu_extra={"mig": {"profile": "1g.6gb"}}), "gpu.mig.profile", "no MIG profiles"),
        (mig_pool("x", "1g.20gb", perGPU=5), "gpu.mig.perGPU", "at most 4"),
        (make_pool("x", H100, memory_mib=90_000, gpu_extra={"mig": {"profile": "3g.40gb"}}), "gpu.memoryMiB",
         "more than the whole"),
    ],
)
def test_an_impossible_mig_pool_is_rejected_naming_the_field(pool: GPUNodePool, field: str, words: str) -> None:
    rejection = resolve_offer(pool, catalog=CATALOG)
    assert isinstance(rejection, PoolRejection)
    assert field in rejection.reason and words in rejection.reason


@pytest.mark.parametrize("profile", ["big", "8g.10gb", "1g.10GB", "1g"])
def test_a_malformed_profile_is_refused_by_the_schema(profile: str) -> None:
    with pytest.raises(ValidationError, match="profile"):
        mig_pool("x", profile)


@pytest.mark.parametrize(
    ("profile", "mig", "field"),
    [("3g.40gb", {"perGPU": 3}, "gpu.mig.perGPU"),
     ("1g.10gb", {"perGPU": 7, "computeFraction": 0.5}, "gpu.mig.computeFraction")],
)
def test_more_slices_than_a_gpu_has_are_refused_naming_the_field(profile: str, mig: dict[str, Any], field: str) -> None:
    # The same words as the CRD's CEL rules (tests/integration/test_mig_lifecycle.py sends them to the API server).
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        mig_pool("x", profile, **mig)


def test_a_small_job_plans_onto_a_slice_at_a_fraction_of_a_whole_gpu() -> None:
    job = make_job().gpt(layers=2, hidden=64, heads=4, vocab=512, sequenceLength=64).batch(8).steps(20).build()
    pools = [whole_pool(), mig_pool("h100-1g", "1g.10gb"), mig_pool("h100-3g", "3g.40gb")]
    result = plan(job, pools=pools, catalog=CATALOG)
    assert result.plan is not None
    assert result.plan.node_pool == "h100-1g" and result.plan.world_size == 1
    assert result.plan.gpu_product.endswith("-MIG-1g.10gb")
    whole = next(c for c in result.alternatives if c.pool == "h100-whole")
    assert result.plan.estimated_cost <= whole.total_cost / 5
    assert any("MIG 1g.10gb slices" in note for note in result.plan.cost_notes)


def test_a_job_too_big_for_any_slice_gets_whole_gpus() -> None:
    # ~6.7B parameters without offload: no 40 GB slice holds its weights, gradients and optimizer states.
    job = (make_job().gpt(layers=32, hidden=4096, heads=32, vocab=32000, sequenceLength=2048)
           .batch(8).steps(10).max_nodes(1).pin(offload="none").build())
    pools = [make_pool("h100-whole", H100, per_node=8, price=H100_PRICE * 8),
             mig_pool("h100-1g", "1g.10gb"), mig_pool("h100-3g", "3g.40gb")]
    result = plan(job, pools=pools, catalog=CATALOG)
    assert result.plan is not None
    assert result.plan.node_pool == "h100-whole"
    assert {r.pool for r in result.rejections} >= {"h100-1g", "h100-3g"}


def test_a_slice_pool_never_gets_a_multi_process_plan() -> None:
    # Only slices: a model that needs several devices has no plan, rather than NCCL across MIG instances.
    job = (make_job().gpt(layers=32, hidden=4096, heads=32, vocab=32000, sequenceLength=2048)
           .batch(8).steps(10).pin(offload="none").build())
    result = plan(job, pools=[mig_pool("h100-3g", "3g.40gb", per_node=8, max_nodes=8)], catalog=CATALOG)
    assert result.plan is None
    assert all(c.world_size == 1 for c in result.alternatives)


def test_the_pods_request_the_profiles_resource() -> None:
    placement = placement_of(mig_pool("h100-1g", "1g.10gb"))
    assert placement.gpu_resource == "nvidia.com/mig-1g.10gb"
    assert placement_of(whole_pool()).gpu_resource == "nvidia.com/gpu"
    job = make_job().gpt(layers=2, hidden=64, heads=4, vocab=512, sequenceLength=64).batch(8).steps(20).build()
    chosen = plan(job, pools=[mig_pool("h100-1g", "1g.10gb")], catalog=CATALOG).plan
    assert chosen is not None
    from factories import OWNER, POD

    manifest = build_training_job(owner=OWNER, spec=job, plan=chosen, placement=placement, pod=POD)
    pod = manifest["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def _node(name: str, allocatable: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"memfit.dev/pool": "h100"}}, "spec": {},
            "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(node: str, resource: str, count: int) -> dict[str, Any]:
    return {"spec": {"nodeName": node, "containers": [{"resources": {"limits": {resource: str(count)}}}]},
            "status": {"phase": "Running"}}


def test_each_pool_counts_its_own_resource_on_shared_nodes() -> None:
    # One node: one whole GPU, one GPU in seven 1g.10gb slices, one in two 3g.40gb slices.
    nodes = [_node("n0", {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"})]
    pods = [_pod("n0", "nvidia.com/mig-1g.10gb", 1), _pod("n0", "nvidia.com/mig-1g.10gb", 1),
            _pod("n0", "nvidia.com/mig-3g.40gb", 2)]
    pools = [whole_pool(), mig_pool("h100-1g", "1g.10gb"), mig_pool("h100-3g", "3g.40gb")]
    capacity = observe_pools(pools, nodes=nodes, pods=pods, catalog=CATALOG)
    assert (capacity["h100-whole"].allocatable_gpus, capacity["h100-whole"].free_gpus) == (1, 1)
    assert (capacity["h100-1g"].allocatable_gpus, capacity["h100-1g"].free_gpus) == (7, 5)
    assert capacity["h100-1g"].free_gpus_on_shared_nodes == (5,)
    assert (capacity["h100-3g"].free_gpus, capacity["h100-3g"].free_whole_nodes) == (0, 0)


def test_the_slice_memory_default_is_its_fraction_and_a_pool_may_state_the_drivers_figure() -> None:
    h100 = CATALOG.find("h100-80")
    pool = mig_pool("h100-1g", "1g.10gb")
    piece = resolve_slice(pool.spec.gpu, h100)
    assert not isinstance(piece, str) and h100 is not None
    assert piece.usable_mib == h100.usable_mib // 8
    stated = make_pool("h100-1g", H100, memory_mib=9856, gpu_extra={"mig": {"profile": "1g.10gb"}})
    piece = resolve_slice(stated.spec.gpu, h100)
    assert not isinstance(piece, str) and piece.usable_mib == 9856

"""The operator's planning adapter: measured peaks (auto-downsizing, OOM), live capacity, config keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cluster_manifests import gfd_node, inference_pod
from memfit.api.common import Offload, OptimizerImplementation, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.plan import Plan
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.kube.profile_cache import Observation
from memfit.lifecycle.capacity import gpus_requested_by_node, observe_pool_capacity
from memfit.lifecycle.planning import config_key, free_gpus, plan_job, strategy_of
from memfit.lifecycle.world import PoolCapacity
from memfit.planner.offers import FreeGpus, Offer, resolve_offer

REPO = Path(__file__).resolve().parents[3]
POOLS = [
    GPUNodePool.model_validate(d)
    for d in yaml.safe_load_all((REPO / "hack/kwok/gpunodepools.yaml").read_text())
]


def spec(layers: int) -> MemoryOptimizedTrainingJobSpec:
    return MemoryOptimizedTrainingJobSpec.model_validate(
        {
            "problem": {
                "builtin": {
                    "kind": "gpt",
                    "layers": layers,
                    "hidden": 2048,
                    "heads": 16,
                    "vocab": 32000,
                    "sequenceLength": 2048,
                }
            },
            "training": {"globalBatchSize": 8},
            "placement": {"maxNodes": 1},
            "strategy": {"offload": "none"},
        }
    )


def run(s: MemoryOptimizedTrainingJobSpec, observations: tuple[Observation, ...] = (), **kw: object):  # type: ignore[no-untyped-def]
    return plan_job(
        spec=s,
        profile=None,
        pools=POOLS,
        capacity=kw.pop("capacity", {}),  # type: ignore[arg-type]
        excluded_pools=kw.pop("excluded", frozenset()),
        observations=observations,  # type: ignore[arg-type]
        attempt=0,
        job_name="j",
        catalog=CATALOG,
    )


def test_measured_peak_below_prediction_moves_to_a_cheaper_plan() -> None:
    job = spec(20)  # memory-bound on L4: ZeRO-3 at micro-batch 2 (a measured peak lets it run 4)
    # Without the A100s (where one GPU is already the cheapest plan, whatever the peak) memory binds.
    others = frozenset({"a100-80-ondemand"})
    first = run(job, excluded=others).plan
    assert first is not None
    seen = Observation(
        config_key(first),
        first.gpu_product,
        first.memory.peak_bytes,
        int(first.memory.peak_bytes * 0.55),
        first.gpu_memory_bytes,
        False,
        "j/0",
    )
    second = run(job, (seen,), excluded=others).plan
    assert second is not None
    assert second.estimated_cost < first.estimated_cost
    def shape(p: Plan) -> tuple[object, ...]:
        return (p.node_pool, p.world_size, p.micro_batch_size, p.zero_stage, p.activation_checkpointing, p.optimizer8bit)
    assert shape(second) != shape(first)  # a smaller layout, or a larger micro-batch / fewer savers on it


def test_oom_makes_the_failed_configuration_need_the_whole_gpu() -> None:
    job = spec(12)
    first = run(job).plan
    assert first is not None
    oom = Observation(
        config_key(first), first.gpu_product, first.memory.peak_bytes, 1, first.gpu_memory_bytes, True, "j/0"
    )
    second = run(job, (oom,)).plan
    assert second is not None
    assert config_key(second) != config_key(first) or second.node_pool != first.node_pool


def test_excluded_pool_is_not_planned_again() -> None:
    job = spec(12)
    first = run(job).plan
    assert first is not None
    second = run(job, excluded=frozenset({first.node_pool})).plan
    assert second is not None and second.node_pool != first.node_pool


def test_config_key_round_trip() -> None:
    plan = run(spec(24)).plan
    assert plan is not None
    strategy = strategy_of(config_key(plan), spec(24))
    assert strategy is not None
    assert strategy.config == plan.training_config()
    assert strategy.world_size == plan.world_size
    assert strategy_of("garbage", spec(24)) is None


def test_config_key_round_trip_keeps_the_techniques_and_reads_old_keys() -> None:
    plan = run(spec(24)).plan
    assert plan is not None
    techniques = plan.model_copy(update={"precision": Precision.BF16_PURE, "optimizer_in_backward": True,
                                         "chunked_loss": True})
    key = config_key(techniques)
    assert key.split("/")[2] == "bf16-pure~optim-in-bwd~chunked-loss"
    strategy = strategy_of(key, spec(24))
    assert strategy is not None and strategy.config == techniques.training_config()
    # A key stored before the techniques existed parses as the same configuration without them.
    plain = plan.model_copy(update={"optimizer_in_backward": False, "chunked_loss": False})
    old = strategy_of(config_key(plain), spec(24))
    assert "~" not in config_key(plain)
    assert old is not None and not old.config.optimizer_in_backward and not old.config.chunked_loss


def test_config_key_keeps_the_optimizer_implementation() -> None:
    plan = run(spec(24)).plan
    assert plan is not None
    for chosen in OptimizerImplementation.FUSED, OptimizerImplementation.FOR_LOOP, None:
        variant = plan.model_copy(update={"optimizer_implementation": chosen, "optimizer8bit": False,
                                          "offload": Offload.NONE, "precision": Precision.BF16,
                                          "chunked_loss": False, "optimizer_in_backward": False})
        key = config_key(variant)
        assert key.split("/")[2] == ("bf16" if chosen is None else f"bf16~impl-{chosen.value}")
        strategy = strategy_of(key, spec(24))
        assert strategy is not None and strategy.config.optimizer_implementation == chosen


def test_free_gpus_counts_whole_free_nodes_room_to_grow_and_shared_nodes() -> None:
    capacity = {
        "l4-ondemand": PoolCapacity(
            nodes=2, ready_nodes=2, allocatable_gpus=8, free_gpus=5, free_whole_nodes=1,
            free_gpus_on_shared_nodes=(1,),
        )
    }
    free = free_gpus(POOLS, capacity)
    # One whole node of 4 (maxNodes 2 = nodes: no room to grow) and a shared node with 1 GPU free.
    assert free["l4-ondemand"] == FreeGpus(whole_nodes=1, on_shared_nodes=(1,))
    assert free["t4-spot"] == FreeGpus(whole_nodes=2)  # unobserved pool: up to maxNodes


def a100_job(layers: int = 24) -> MemoryOptimizedTrainingJobSpec:
    job = spec(layers).model_dump(by_alias=True, exclude_none=True)
    job["placement"]["nodePools"] = ["a100-80-ondemand"]
    # Checkpoints on the pod's disk: an 8B model's 130 GB save at the default volume speed would dominate
    # this short run and decide the layout; these cases are about where the GPUs come from.
    job["training"]["checkpoint"] = {"emptyDir": True}
    return MemoryOptimizedTrainingJobSpec.model_validate(job)


def a100_capacity(*shared: int, whole: int = 0) -> dict[str, PoolCapacity]:
    """The one-node a100 pool (maxNodes 1) as observed: `shared` free GPUs on a node others use."""
    return {"a100-80-ondemand": PoolCapacity(
        nodes=1, ready_nodes=1, allocatable_gpus=8, free_gpus=sum(shared) + 8 * whole, free_whole_nodes=whole,
        free_gpus_on_shared_nodes=tuple(shared))}


# 160 layers x 2048 (8.1B parameters): ZeRO-3 on 2 A100s at least; 4 when a whole node is free.
SHARED_NODE_CASES = {
    "2 free on a shared node: 2 GPUs there": ((2,), 0, 2, "a node other pods already use"),
    "4 and 2 free on shared nodes: 4 GPUs on the fuller": ((4, 2), 0, 4, "a node other pods already use"),
    "a whole free node: 4 of its GPUs": ((), 1, 4, "a node"),
}


@pytest.mark.parametrize("case", SHARED_NODE_CASES, ids=list(SHARED_NODE_CASES))
def test_a_plan_that_fits_in_part_of_a_node_uses_a_shared_node_and_pays_for_its_gpus(case: str) -> None:
    shared, whole, gpus, where = SHARED_NODE_CASES[case]
    outcome = run(a100_job(160), capacity=a100_capacity(*shared, whole=whole))
    p = outcome.plan
    assert p is not None and p.node_pool == "a100-80-ondemand"
    assert (p.nodes, p.gpus_per_node) == (1, gpus)
    assert p.price_per_hour == pytest.approx(27.45 * gpus / 8)
    assert p.estimated_cost == pytest.approx(p.price_per_hour * p.estimated_hours, rel=1e-4)  # both rounded
    note = f"uses {gpus} of the 8 GPUs of {where} (a100-80-ondemand): priced {gpus}/8 of $27.45/h"
    assert p.cost_notes[0].startswith(note)
    assert ("stay free for other pods" in p.cost_notes[0]) == (not shared)
    assert outcome.summary is not None and outcome.summary.cost_note is not None
    assert note in outcome.summary.cost_note and note in outcome.message()


def test_a_shared_node_with_too_few_free_gpus_is_not_planned_on() -> None:
    # 240 layers: past what one GPU holds even with every block's input offloaded to host memory.
    one_free = run(a100_job(240), capacity=a100_capacity(1))  # needs 2 GPUs at least
    assert one_free.plan is None and "on 1 GPU; has 80.0 GiB" in one_free.message()
    none_free = run(a100_job(160), capacity=a100_capacity())
    assert none_free.plan is None and "no free GPUs right now" in none_free.message()


def test_from_node_and_pod_manifests_to_a_plan_on_the_free_gpus_of_a_busy_node() -> None:
    """The operator's path: Nodes and Pods -> pool capacity -> free GPUs -> plan (maxNodes 1: no new node)."""
    pool = next(p for p in POOLS if p.metadata.name == "a100-80-ondemand")
    used = gpus_requested_by_node([inference_pod("llama-8b", "a100-a", 2), inference_pod("mistral", "a100-a", 2)])
    capacity = {"a100-80-ondemand": observe_pool_capacity(
        selector=pool.spec.node_selector, gpus_per_node=8, nodes=[gfd_node("a100-a")], used_by_node=used)}
    assert free_gpus([pool], capacity)["a100-80-ondemand"] == FreeGpus(whole_nodes=0, on_shared_nodes=(4,))
    p = run(a100_job(160), capacity=capacity).plan
    assert p is not None and (p.nodes, p.gpus_per_node) == (1, 4)
    assert p.cost_notes[0].startswith("uses 4 of the 8 GPUs of a node other pods already use")


def test_a_partly_used_node_is_only_offered_for_layouts_it_can_hold() -> None:
    pool = next(p for p in POOLS if p.metadata.name == "a100-80-ondemand")
    offer = resolve_offer(pool, catalog=CATALOG, free_gpus=FreeGpus(whole_nodes=0, on_shared_nodes=(3, 1)))
    assert isinstance(offer, Offer)
    assert [(lay.nodes, lay.gpus_per_node, lay.shared_node) for lay in offer.layouts()] == [(1, 1, True), (1, 2, True)]
    offer = resolve_offer(pool, catalog=CATALOG, free_gpus=FreeGpus(whole_nodes=1, on_shared_nodes=(2,)))
    assert isinstance(offer, Offer)
    assert [(lay.nodes, lay.gpus_per_node, lay.shared_node) for lay in offer.layouts()] == [
        (1, 1, True), (1, 2, True), (1, 4, False), (1, 8, False)]


def test_a_cpu_measured_allocator_peak_teaches_the_tensor_terms() -> None:
    job = spec(24)
    first = run(job).plan
    assert first is not None
    allocated = first.memory.parameters_bytes + first.memory.gradients_bytes + first.memory.optimizer_bytes
    seen = Observation(config_key(first), first.gpu_product, first.memory.peak_bytes, int(allocated * 0.5),
                       first.gpu_memory_bytes, False, "j/0", device="cpu", rank_peaks=(1, int(allocated * 0.5)))
    second = run(job, (seen,)).plan
    assert second is not None and second.estimated_cost <= first.estimated_cost
    assert second.memory.peak_bytes < first.memory.peak_bytes or config_key(second) != config_key(first)


def test_a_measured_peak_above_the_prediction_only_moves_later_runs_up() -> None:
    job = spec(12)
    first = run(job).plan
    assert first is not None
    big = first.memory.peak_bytes * 2  # well above the predicted allocated bytes
    seen = Observation(config_key(first), first.gpu_product, first.memory.peak_bytes, big,
                       first.gpu_memory_bytes, False, "j/0", rank_peaks=(big // 2, big))
    second = run(job, (seen,)).plan
    assert second is not None
    assert second.memory.peak_bytes >= first.memory.peak_bytes or config_key(second) != config_key(first)
    assert second.estimated_cost >= first.estimated_cost


def test_a_reserved_peak_on_one_gpu_does_not_teach_another() -> None:
    job = spec(12)
    first = run(job).plan
    assert first is not None
    seen = Observation(config_key(first), first.gpu_product, first.memory.peak_bytes, 1, first.gpu_memory_bytes,
                       False, "j/0", device="Some-Other-GPU", rank_peaks=(first.memory.peak_bytes,),
                       reserved_peak_bytes=first.memory.peak_bytes * 3, device_peak_bytes=first.memory.peak_bytes * 4)
    again = run(job, (seen,)).plan
    assert again is not None
    # Its tensor bytes still teach the tensor terms; its device terms teach only Some-Other-GPU.
    assert again.node_pool == first.node_pool or again.estimated_cost >= first.estimated_cost


def _lora_spec(rank: int, allowed: tuple[str, ...] = ("none", "lora")) -> MemoryOptimizedTrainingJobSpec:
    return spec(24).model_copy(update={"strategy": spec(24).strategy.model_copy(update={
        "peft": MemoryOptimizedTrainingJobSpec.model_validate({
            "problem": {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}},
            "strategy": {"peft": {"method": "auto", "allowed": list(allowed), "lora": {"rank": rank}}},
        }).strategy.peft})})


def test_a_lora_run_is_keyed_with_its_adapters_and_never_read_as_a_full_fine_tune() -> None:
    job = _lora_spec(16, allowed=("lora",))
    plan = run(job).plan
    assert plan is not None and plan.peft.value == "lora"
    key = config_key(plan)
    assert key.endswith("/lora:16:fc+out+proj+qkv")
    strategy = strategy_of(key, job)
    assert strategy is not None and strategy.config == plan.training_config() and strategy.adapter is not None
    # Another job of the same problem with other adapters (or none allowed) ignores the observation.
    assert strategy_of(key, _lora_spec(8)) is None
    assert strategy_of(key, spec(24)) is None
    # A measured LoRA peak far below a full fine-tune's prediction leaves full fine-tunes alone.
    low = plan.memory.peak_bytes // 4
    seen = Observation(key, plan.gpu_product, plan.memory.peak_bytes, low, plan.gpu_memory_bytes, False, "j/0",
                       rank_peaks=(low,))
    full_only = run(spec(24)).plan
    assert full_only is not None
    assert run(spec(24), (seen,)).plan == full_only


def test_identical_inputs_with_the_same_usable_room_are_planned_once() -> None:
    """planner.memo: identical jobs planned against capacity snapshots that leave them the same room run
    one search; room beyond what the job can use (more free nodes than its maxNodes) changes nothing,
    less room or a measured peak plans again."""
    from memfit.lifecycle.planning import PLAN_MEMO

    def room(whole: int) -> dict[str, PoolCapacity]:
        return {"a100-80-ondemand": PoolCapacity(nodes=whole, ready_nodes=whole, allocatable_gpus=8 * whole,
                                                 free_gpus=8 * whole, free_whole_nodes=whole)}

    job = spec(24)
    job = job.model_copy(update={"placement": job.placement.model_copy(update={"max_nodes": 2})})
    first = run(job, capacity=room(2))
    hits = PLAN_MEMO.hits
    again = run(job, capacity=room(2))  # another job, the same spec, a new snapshot object
    assert PLAN_MEMO.hits == hits + 1 and again.plan == first.plan
    run(job, capacity=room(5))  # 5 free nodes: a 2-node job cannot tell them from 2
    assert PLAN_MEMO.hits == hits + 2
    misses = PLAN_MEMO.misses
    run(job, capacity=room(1))  # one node fewer than the job could use
    assert first.plan is not None
    seen = Observation(config_key(first.plan), first.plan.gpu_product, first.plan.memory.peak_bytes,
                       first.plan.memory.peak_bytes // 2, first.plan.gpu_memory_bytes, False, "j")
    run(job, (seen,), capacity=room(2))
    assert PLAN_MEMO.misses == misses + 2

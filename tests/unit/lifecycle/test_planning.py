"""The operator's planning adapter: measured peaks (auto-downsizing, OOM), live capacity, config keys."""

from __future__ import annotations

from pathlib import Path

import yaml
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.kube.profile_cache import Observation
from memfit.lifecycle.planning import config_key, free_gpus, plan_job, strategy_of
from memfit.lifecycle.world import PoolCapacity

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
    job = spec(24)
    first = run(job).plan
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
    second = run(job, (seen,)).plan
    assert second is not None
    assert second.estimated_cost < first.estimated_cost
    assert second.world_size < first.world_size or second.node_pool != first.node_pool


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


def test_free_gpus_counts_whole_free_nodes_and_room_to_grow() -> None:
    capacity = {
        "l4-ondemand": PoolCapacity(
            nodes=2, ready_nodes=2, allocatable_gpus=8, free_gpus=5, free_whole_nodes=1
        )
    }
    free = free_gpus(POOLS, capacity)
    assert free["l4-ondemand"] == 4  # one whole node of 4; maxNodes 2 = nodes, no room to grow
    assert free["t4-spot"] == 2  # unobserved pool: up to maxNodes x GPUs per node


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

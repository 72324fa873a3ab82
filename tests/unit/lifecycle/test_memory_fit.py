"""The memfit.dev/memory-fit AdmissionCheck's verdicts (memfit.lifecycle.admission.memory_fit): pure, no cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from memfit.api.job import MemoryOptimizedTrainingJob
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.lifecycle.admission.memory_fit import (
    GpuRequest,
    Verdict,
    check_memory_fit,
    gpu_request,
    parse_problem,
    pool_of_flavor,
)

REPO = Path(__file__).resolve().parents[3]
POOLS = [GPUNodePool.model_validate(d) for d in yaml.safe_load_all((REPO / "hack/kwok/gpunodepools.yaml").read_text()) if d]
BY_NAME = {p.metadata.name: p for p in POOLS}
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}


def job(config: dict[str, Any], strategy: dict[str, Any] | None = None) -> MemoryOptimizedTrainingJob:
    text = yaml.safe_dump({
        "apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": "x"},
        "spec": {"problem": {"huggingface": {"model": "org/m", "config": config, "sequenceLength": 1024}},
                 "training": {"globalBatchSize": 8}, "strategy": strategy or {}},
    })
    parsed = parse_problem(text, "cm/job.yaml")
    assert isinstance(parsed, MemoryOptimizedTrainingJob), parsed
    return parsed


def verdict(j: MemoryOptimizedTrainingJob, flavor: str, pods: int = 1, per_pod: int = 1,
            queue: list[str] | None = None) -> Verdict:
    return check_memory_fit(j, GpuRequest(flavor, pods, per_pod), pool=BY_NAME.get(flavor),
                            queue_pools=[BY_NAME[n] for n in (queue if queue is not None else list(BY_NAME))],
                            catalog=CATALOG)


def test_a_model_that_fits_the_flavor_is_ready() -> None:
    v = verdict(job(GPT2), "t4-spot")
    assert v.state == "Ready"
    assert v.message.startswith("fits: needs ") and "flavor t4-spot (Tesla-T4) has 15.0 GiB" in v.message
    assert "DDP fp16" in v.message  # precision auto on a T4 (no bf16) is fp16, as a practitioner runs it


def test_too_big_for_the_flavor_is_rejected_naming_the_cheapest_flavor_where_it_fits_as_declared() -> None:
    v = verdict(job(LLAMA_1B), "t4-spot")
    assert v.state == "Rejected"
    # 1.1B full fine-tune under DDP: 16 bytes/param of model state alone exceed the L4's 22.5 GiB.
    assert v.message.startswith("needs ") and "flavor t4-spot (Tesla-T4) has 15.0 GiB" in v.message
    assert v.message.endswith("fits on flavor a100-80-ondemand (NVIDIA-A100-SXM4-80GB, 80.0 GiB) as declared")


def test_without_a_flavor_that_holds_the_declared_strategy_it_names_memfits_plan() -> None:
    v = verdict(job(LLAMA_1B), "t4-spot", queue=["t4-spot", "l4-ondemand"])
    assert v.state == "Rejected"
    assert "fits on flavor l4-ondemand with" in v.message and "memfit's plan" in v.message


def test_the_declared_strategy_counts_more_gpus_shard_more() -> None:
    """ZeRO-3 over 4 L4s in one pod holds the 1.1B model that DDP cannot."""
    declared = job(LLAMA_1B, {"engine": "deepspeed", "zeroStage": 3})
    assert verdict(declared, "l4-ondemand", per_pod=4).state == "Ready"
    assert verdict(job(LLAMA_1B, {"engine": "ddp"}), "l4-ondemand", per_pod=4).state == "Rejected"


def test_impossible_pins_and_unsized_problems_are_rejected_naming_the_field() -> None:
    pins = parse_problem(yaml.safe_dump({
        "apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": "x"},
        "spec": {"problem": {"huggingface": {"model": "org/m", "config": GPT2}},
                 "strategy": {"engine": "ddp", "offload": "nvme"}}}), "cm/job.yaml")
    assert isinstance(pins, str) and "spec.strategy.offload: offload nvme needs engine deepspeed" in pins
    no_config = parse_problem(yaml.safe_dump({
        "apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": "x"},
        "spec": {"problem": {"huggingface": {"model": "org/m"}}}}), "cm/job.yaml")
    assert isinstance(no_config, MemoryOptimizedTrainingJob)
    v = verdict(no_config, "t4-spot")
    assert v.state == "Rejected" and v.message.startswith("memfit.dev/problem: spec.problem: ")


def test_a_flavor_that_is_no_pool_is_retried() -> None:
    v = verdict(job(GPT2), "mystery-gpu")
    assert v.state == "Retry" and "flavor mystery-gpu is no GPUNodePool" in v.message


@pytest.mark.parametrize(("text", "expected"), [
    ("a: [", "cm/job.yaml: not YAML"),
    ("kind: ConfigMap\n", "cm/job.yaml: no MemoryOptimizedTrainingJob document"),
    ("kind: MemoryOptimizedTrainingJob\napiVersion: memfit.dev/v1alpha1\nmetadata: {name: x}\nspec: {problem: {}}\n",
     "cm/job.yaml: spec: spec.problem: exactly one of"),
])
def test_bad_problem_documents_say_what_is_wrong(text: str, expected: str) -> None:
    parsed = parse_problem(text, "cm/job.yaml")
    assert isinstance(parsed, str) and parsed.startswith(expected), parsed


def test_gpu_request_reads_the_assigned_flavor_and_the_largest_gpu_pod_set() -> None:
    def pod_set(name: str, count: int, gpus: int) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        return {"name": name, "count": count,
                "template": {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}}

    workload = {
        "spec": {"podSets": [pod_set("launcher", 1, 0), pod_set("workers", 2, 4)]},
        "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "launcher", "count": 1, "flavors": {"cpu": "default"}},
            {"name": "workers", "count": 2, "flavors": {"nvidia.com/gpu": "l4-ondemand"}}]}},
    }
    request = gpu_request(workload)
    assert request == GpuRequest("l4-ondemand", 2, 4) and request.world_size == 8
    assert gpu_request({"spec": workload["spec"], "status": {}}) is None


def test_a_flavor_maps_to_its_pool_by_name_else_by_node_labels() -> None:
    assert pool_of_flavor("t4-spot", {}, POOLS) is BY_NAME["t4-spot"]
    assert pool_of_flavor("team-t4", dict(BY_NAME["t4-spot"].spec.node_selector), POOLS) is BY_NAME["t4-spot"]
    assert pool_of_flavor("team-x", {"other": "label"}, POOLS) is None

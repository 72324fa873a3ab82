"""Profiling depth and pool (lifecycle/profile_fit.py) and the lifecycle around them: depth-reduced
profiling Jobs, reuse of a full-depth profile, the AnalyticOnly fallback."""

from __future__ import annotations

from typing import Any

import pytest
from lifecycle_harness import POOLS, WORLD, Harness, quickstart
from memfit.api.hashing import profile_cache_key
from memfit.api.job import MemoryOptimizedTrainingJobSpec, MemoryOptimizedTrainingJobStatus, Phase
from memfit.api.profile import Profile
from memfit.catalog import CATALOG
from memfit.controller.read_snapshot import launch_settings
from memfit.kube.profile_cache import CachedProfile, build_profile_cache
from memfit.lifecycle.profile_fit import ANALYTIC, FULL, REDUCED, choose_profiling
from memfit.lifecycle.profiling import profile_keys
from memfit.memory.problems import shape_from_problem
from memfit.planner import ANALYTIC_HEADROOM_PERCENT

LLAMA = {  # Llama-2 shapes (published configs); sequence 2048
    "7b": (4096, 11008, 32, 32, 32),
    "13b": (5120, 13824, 40, 40, 40),
    "70b": (8192, 28672, 64, 8, 80),
}


def llama(size: str, **spec: Any) -> dict[str, Any]:
    h, f, heads, kv, layers = LLAMA[size]
    config = {"model_type": "llama", "hidden_size": h, "intermediate_size": f, "num_attention_heads": heads,
              "num_key_value_heads": kv, "num_hidden_layers": layers, "vocab_size": 32000,
              "max_position_embeddings": 4096}
    doc = quickstart(problem={"huggingface": {"model": f"meta-llama/Llama-2-{size}-hf", "sequenceLength": 2048,
                                              "config": config}})
    doc.pop("placement", None)
    doc.update(spec)
    return doc


def pools(*names: str) -> list[Any]:
    by_name = {p.metadata.name: p for p in POOLS}
    ordered = sorted((by_name[n] for n in names), key=lambda p: p.spec.price_per_node_hour / p.spec.gpu.per_node)
    return ordered


CHOICES: dict[str, tuple[dict[str, Any], tuple[str, ...], str, str | None]] = {
    "tiny GPT: full depth on the cheapest pool": (quickstart(), ("t4-spot", "l4-ondemand"), FULL, "t4-spot"),
    "13B: 2 of 40 blocks fit an L4, not a T4": (llama("13b"), ("t4-spot", "l4-ondemand"), REDUCED, "l4-ondemand"),
    "7B: 2 of 32 blocks need 14.2 GiB, more than a T4: the A100": (
        llama("7b"), ("t4-spot", "a100-80-ondemand"), REDUCED, "a100-80-ondemand"),
    "70B on T4 and L4 only: analytic": (llama("70b"), ("t4-spot", "l4-ondemand"), ANALYTIC, None),
    "70B with an A100-80: reduced there": (llama("70b"), ("t4-spot", "a100-80-ondemand"), REDUCED, "a100-80-ondemand"),
    "depth full pinned: never reduced": (llama("13b", profiling={"depth": "full"}), ("t4-spot",), FULL, "t4-spot"),
    "depth reduced pinned on a 12-block GPT": (quickstart(profiling={"depth": "reduced"}, problem={"builtin": {
        "kind": "gpt", "layers": 12, "hidden": 256, "heads": 4, "vocab": 2048, "sequenceLength": 256}}),
        ("t4-spot",), REDUCED, "t4-spot"),
    "depth reduced pinned, 2 blocks: nothing to reduce": (
        quickstart(profiling={"depth": "reduced"}), ("t4-spot",), FULL, "t4-spot"),
    "entrypoint (no analytic shape): full": (quickstart(problem={"entrypoint": "pkg.mod:fn"}), ("t4-spot",), FULL, "t4-spot"),
}


@pytest.mark.parametrize("case", CHOICES, ids=list(CHOICES))
def test_choose_profiling(case: str) -> None:
    doc, names, depth, pool = CHOICES[case]
    spec = MemoryOptimizedTrainingJobSpec.model_validate(doc)
    choice = choose_profiling(spec, pools(*names), CATALOG)
    assert choice.depth == depth
    assert (choice.pool.metadata.name if choice.pool else None) == pool
    if depth == ANALYTIC:
        assert "not even 2 of its 80 blocks fits one GPU" in choice.reason
        assert f"{ANALYTIC_HEADROOM_PERCENT} percentage points more memory headroom" in choice.reason


def test_cache_key_covers_the_depth_and_keeps_full_depth_keys() -> None:
    problem = MemoryOptimizedTrainingJobSpec.model_validate(quickstart()).problem
    common = {"optimizer": "adamw", "optimizer8bit": "auto", "image": "i", "gpu_product": "Tesla-T4"}
    full = profile_cache_key(problem, **common)
    assert profile_cache_key(problem, depth="full", **common) == full  # older caches stay valid
    assert len({full, profile_cache_key(problem, depth="reduced", **common),
                profile_cache_key(problem, depth="analytic", **common)}) == 3


def test_large_model_profiles_depth_reduced_on_the_pool_where_it_fits() -> None:
    h = Harness(spec=llama("13b"))
    h.reconcile()
    assert h.stored.phase == Phase.PROFILING
    job = h.job("j-profile")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--depth", "reduced"]
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"}
    message = h.condition("Profiled")[2]
    assert message.startswith("profiling on pool l4-ondemand (Job j-profile, depth-reduced: the full model needs")
    assert "2 of its 40 blocks need" in message


def test_cached_full_depth_profile_is_reused_by_a_depth_reduced_job() -> None:
    h = Harness(spec=llama("13b"))
    spec = MemoryOptimizedTrainingJobSpec.model_validate(h.spec)
    full_key, reduced_key = profile_keys(spec, MemoryOptimizedTrainingJobStatus(), launch_settings(
        __import__("lifecycle_harness").SETTINGS), WORLD)
    assert full_key != reduced_key
    profile = Profile(problem_hash=full_key, shape=shape_from_problem(spec.problem))
    cache = build_profile_cache(namespace="ns", problem_hash=full_key, cached=CachedProfile(profile, ()))
    h.objects[("ConfigMap", cache["metadata"]["name"])] = cache
    decision = h.reconcile()
    assert decision.reasons()[0] == "ProfileCached"
    assert h.stored.profile is not None and h.stored.profile.problem_hash == full_key[:16]
    assert "Job/j-profile" not in h.children()


def test_model_that_fits_no_profiling_pool_is_planned_analytically() -> None:
    doc = llama("70b", placement={"nodePools": ["t4-spot", "l4-ondemand"], "maxNodes": 8})
    h = Harness(spec=doc)
    decision = h.reconcile()
    status, reason, message = h.condition("Profiled")
    assert (status, reason) == ("False", "AnalyticOnly")
    assert message.startswith("not profiled: not even 2 of its 80 blocks fits one GPU of an allowed pool")
    assert "AnalyticOnly" in decision.reasons()
    assert "Job/j-profile" not in h.children()
    assert h.stored.profile is not None and h.stored.profile.source == "analytic"
    cached = [k for k in h.children() if k.startswith("ConfigMap/memfit-profile-")]
    assert len(cached) == 1  # stored like a profile, so attempts' measured peaks are learned
    if h.stored.phase == Phase.LAUNCHING:
        plan = h.plan_json(0)
        assert plan["headroomPercent"] == 10 + ANALYTIC_HEADROOM_PERCENT
    else:  # 70B on 8 nodes of T4/L4 may not fit even sharded: a NoFit that names the analytic plan
        assert h.condition("Failed")[1] == "NoFit"
    again = h.reconcile()
    assert again.effects == () and again.events == ()

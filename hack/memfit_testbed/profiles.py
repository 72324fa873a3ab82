"""Seed the shared profile cache, as an earlier job with the same key would have left it."""

from __future__ import annotations

from typing import Any

from memfit.api.job import MemoryOptimizedTrainingJobSpec, MemoryOptimizedTrainingJobStatus
from memfit.api.profile import Profile
from memfit.controller.kubeapi import KubeApi
from memfit.controller.read_snapshot import launch_settings
from memfit.controller.settings import OperatorSettings
from memfit.controller.world_cache import observe_world
from memfit.kube.profile_cache import CachedProfile, build_profile_cache
from memfit.lifecycle.profiling import profile_key
from memfit.memory.problems import shape_from_problem

# The settings of the operator the test bed runs (`operator_helpers.operator_process`).
TEST_BED_SETTINGS = OperatorSettings(trainer_image="memfit-trainer:test")


def cache_key(api: KubeApi, doc: dict[str, Any], settings: OperatorSettings | None = None) -> str:
    """The profile cache key the operator (run with `settings`, default: its environment defaults)
    computes for the MOTJ `doc` against the pools in the cluster now."""
    spec = MemoryOptimizedTrainingJobSpec.model_validate(doc["spec"])
    launch = launch_settings(settings or TEST_BED_SETTINGS)
    return profile_key(spec, MemoryOptimizedTrainingJobStatus(), launch, observe_world(api))


def seed_profile(
    api: KubeApi, namespace: str, doc: dict[str, Any], settings: OperatorSettings | None = None
) -> Profile:
    """Put the problem's analytic profile in the namespace's cache under the job's key, so the job
    skips profiling; returns it."""
    spec = MemoryOptimizedTrainingJobSpec.model_validate(doc["spec"])
    key = cache_key(api, doc, settings)
    profile = Profile(problem_hash=key, shape=shape_from_problem(spec.problem))
    api.ensure(build_profile_cache(namespace=namespace, problem_hash=key, cached=CachedProfile(profile, ())))
    return profile

"""Profile cache ConfigMap: round trip, and unreadable caches are ignored (the job profiles again)."""

from __future__ import annotations

from memfit.api.profile import Profile
from memfit.kube.profile_cache import CachedProfile, Observation, build_profile_cache, parse_profile_cache


def test_round_trip_with_observations() -> None:
    obs = Observation("deepspeed/2/bf16", "NVIDIA-L4", 10, 12, 20, False, "a/0")
    cached = CachedProfile(Profile(problem_hash="abc"), (obs,))
    cm = build_profile_cache(namespace="ml", problem_hash="f" * 64, cached=cached)
    assert cm["metadata"]["name"] == "memfit-profile-" + "f" * 16
    assert "ownerReferences" not in cm["metadata"]  # outlives the jobs that made it
    assert parse_profile_cache(cm["data"]) == cached


def test_garbage_is_ignored() -> None:
    assert parse_profile_cache(None) is None
    assert parse_profile_cache({"profile.json": "{not json"}) is None
    assert parse_profile_cache({"profile.json": '{"problemHash": "x"}', "observations.json": "[{}]"}) is None

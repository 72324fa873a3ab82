"""A profile cache is read once while trusted (controller.kept_profiles), and never hides this operator's
own write: not after it, and not from a read that began before it ended."""

from __future__ import annotations

from typing import Any

from memfit.api.profile import Profile
from memfit.controller.kept_profiles import KeptProfiles
from memfit.controller.kubeapi import KubeApi
from memfit.kube.profile_cache import CachedProfile, Observation, build_profile_cache

NAME = "memfit-profile-" + "a" * 16


def cache_map(*peaks: int) -> dict[str, Any]:
    observations = tuple(Observation("ddp/0/bf16", "NVIDIA-L4", p, p, 8, False, f"j{p}/0") for p in peaks)
    return build_profile_cache(namespace="ns", problem_hash="a" * 64,
                               cached=CachedProfile(Profile(problem_hash="a" * 16), observations))


def peaks(found: CachedProfile | None) -> list[int]:
    assert found is not None
    return [o.measured_peak_bytes for o in found.observations]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ConfigMapApi(KubeApi):
    """Serves one ConfigMap and takes writes of it (no clients: nothing reaches a cluster); GETs counted."""

    def __init__(self, kept: KeptProfiles | None, stored: dict[str, Any] | None) -> None:
        self.kept_profiles, self.stored, self.gets = kept, stored, 0
        self.during_get: Any = None  # called inside the GET, before it answers: a concurrent write

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        answer = self.stored
        if self.during_get is not None:
            write, self.during_get = self.during_get, None
            write()
        return answer

    def _create(self, kind: str, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        self.stored = manifest
        return manifest

    def replace_config_map_data(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.stored = {**(self.stored or {}), "data": data}
        super().replace_config_map_data(namespace, name, data)

    @property
    def core(self) -> Any:  # replace_config_map_data's client call: the write above already happened
        return type("Core", (), {"patch_namespaced_config_map": staticmethod(lambda *a, **k: None)})()


def test_a_found_profile_is_read_once_while_trusted_and_again_after() -> None:
    clock = Clock()
    api = ConfigMapApi(KeptProfiles(clock, trust_seconds=20.0), cache_map(10))
    assert peaks(api.profile_cache("ns", NAME)) == [10]
    assert peaks(api.profile_cache("ns", NAME)) == [10]
    assert api.gets == 1
    clock.now = 21.0
    api.stored = cache_map(10, 11)  # somebody else's write shows once the kept read is no longer trusted
    assert peaks(api.profile_cache("ns", NAME)) == [10, 11]
    assert api.gets == 2


def test_an_absent_profile_is_not_kept() -> None:
    api = ConfigMapApi(KeptProfiles(Clock()), None)
    assert api.profile_cache("ns", NAME) is None
    api.stored = cache_map(10)  # the profiling pod's result lands: the next pass sees it
    assert peaks(api.profile_cache("ns", NAME)) == [10]
    assert api.gets == 2


def test_our_own_write_is_seen_by_the_next_read() -> None:
    api = ConfigMapApi(KeptProfiles(Clock()), cache_map(10))
    assert peaks(api.profile_cache("ns", NAME)) == [10]
    api.replace_config_map_data("ns", NAME, cache_map(10, 12)["data"])  # a finished attempt learns
    assert peaks(api.profile_cache("ns", NAME)) == [10, 12]
    assert api.gets == 2


def test_a_read_that_began_before_our_write_ended_is_not_kept() -> None:
    api = ConfigMapApi(KeptProfiles(Clock()), cache_map(10))
    api.profile_cache("ns", NAME)  # known, so its writes are counted
    api.replace_config_map_data("ns", NAME, cache_map(10, 12)["data"])
    old = cache_map(10, 12)
    api.stored = old
    # A pass GETs the profile; while its answer is on the way another worker's write ends.
    api.during_get = lambda: api.replace_config_map_data("ns", NAME, cache_map(10, 12, 13)["data"])
    assert peaks(api.profile_cache("ns", NAME)) == [10, 12]  # what that GET answered
    assert peaks(api.profile_cache("ns", NAME)) == [10, 12, 13]  # not kept: read again
    assert api.gets == 3


def test_a_created_profile_cache_replaces_the_kept_one() -> None:
    api = ConfigMapApi(KeptProfiles(Clock()), cache_map(10))
    api.profile_cache("ns", NAME)
    api.ensure(cache_map(10, 14))  # a profiling result written again (the object was deleted meanwhile)
    assert peaks(api.profile_cache("ns", NAME)) == [10, 14]


def test_without_a_runtime_every_read_reaches_the_api_server() -> None:
    api = ConfigMapApi(None, cache_map(10))
    api.profile_cache("ns", NAME)
    api.profile_cache("ns", NAME)
    assert api.gets == 2

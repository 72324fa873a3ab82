"""The profile caches this operator read lately, parsed, so planning passes need not GET and validate the
same profile again and again.

Every pass that plans a job reads the profile cache ConfigMap of its digest, and every job that finishes
reads it again to add its measured peak (lifecycle.learning): two GETs per job and two validations of
the whole profile, for an object that is shared by every job of the same model and changes only when an
attempt finishes. A profile cache found by a read is kept, parsed, for at most `trust_seconds` (the bound
of the operator's other kept reads, controller.watched_jobs). Once the operator's own write of a
ConfigMap has ended it is forgotten, and a read that began before that is not kept, so a pass never sees
a profile older than this operator's last write; a write by somebody else (another operator, a user)
shows within `trust_seconds`. An absent profile is never kept: a job waiting for its profile looks again
every pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from memfit.controller.watched_jobs import TRUST_SECONDS
from memfit.kube.profile_cache import CachedProfile, parse_profile_cache

Manifest = dict[str, Any]
Key = tuple[str, str]  # (namespace, ConfigMap name)
SWEEP_EVERY = 256  # keeps between two sweeps of the entries no longer trusted


class KeptProfiles:
    """(namespace, name) -> the parsed profile cache read and when; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, trust_seconds: float = TRUST_SECONDS) -> None:
        self._clock = clock
        self._trust = trust_seconds
        self._lock = threading.Lock()
        self._kept: dict[Key, tuple[float, CachedProfile]] = {}
        self._writes: dict[Key, int] = {}  # this operator's writes of each profile read so far, counted
        self._keeps = 0

    def read(self, namespace: str, name: str, get: Callable[[str, str], Manifest | None]) -> CachedProfile | None:
        """The profile cache `namespace/name`: the kept one while trusted, else `get` it and keep it."""
        key = (namespace, name)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and self._clock() - kept[0] <= self._trust:
                return kept[1]
            writes = self._writes.setdefault(key, 0)
            read_at = self._clock()
        parsed = parse_profile_cache((get(namespace, name) or {}).get("data"))
        if parsed is None:
            return None
        with self._lock:
            if self._writes.get(key, 0) == writes:  # no write of ours since the read began
                self._kept[key] = (read_at, parsed)
                self._keeps += 1
                if self._keeps % SWEEP_EVERY == 0:
                    self._sweep()
        return parsed

    def written(self, namespace: str, name: str) -> None:
        """A write of ConfigMap `namespace/name` by this operator ended (or failed): forget the kept
        profile, and keep no read that began before. (Only profiles read so far are counted: nothing
        can be kept of the others.)"""
        key = (namespace, name)
        with self._lock:
            self._kept.pop(key, None)
            if key in self._writes:
                self._writes[key] += 1

    def _sweep(self) -> None:
        now = self._clock()
        for key in [k for k, (at, _) in self._kept.items() if now - at > self._trust]:
            del self._kept[key]

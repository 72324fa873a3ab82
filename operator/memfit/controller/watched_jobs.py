"""The newest body of each memfit Job the watch (or a read) showed, so a reconcile pass need not GET it.

The operator watches its own Jobs (`handlers.on_child_job_event`) to know when to reconcile; kopf has
decoded every event's body already, and the pass that follows used to GET and decode the same Job again
(about a tenth of the operator's CPU at 1,000 jobs, benchmarks/scale.py). A kept body is trusted for
TRUST_SECONDS after the watch or a read showed it: a deletion the watch missed (a reconnect after the
API server compacted its history) is found by a GET at most that long after, and a pass that acts on a
Job that is gone fails its write harmlessly and is queued again by the Job's DELETED event. A Job the
watch does not cover is simply not kept: it is read from the API server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Manifest = dict[str, Any]
TRUST_SECONDS = 20.0


class WatchedJobs:
    """(namespace, name) -> the newest Job body seen and when; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, trust_seconds: float = TRUST_SECONDS) -> None:
        self._clock = clock
        self._trust = trust_seconds
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[float, Manifest]] = {}
        self.hits = 0
        self.misses = 0

    def seen(self, body: Manifest) -> bool:
        """Keep `body` unless a newer version of the same Job is kept (managedFields dropped). False when
        exactly this version was kept already (the watch's echo of the operator's own create): nothing
        new to look at."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        slim = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and same_version(slim, kept[1]):
                self._kept[key] = (self._clock(), kept[1])
                return False
            if kept is None or not older(slim, kept[1]):
                self._kept[key] = (self._clock(), slim)
            return True

    def gone(self, namespace: str, name: str) -> None:
        """The Job was deleted (or a read found none)."""
        with self._lock:
            self._kept.pop((namespace, name), None)

    def get(self, namespace: str, name: str) -> Manifest | None:
        """The kept body while it is trusted, else None (read it from the API server)."""
        with self._lock:
            kept = self._kept.get((namespace, name))
            if kept is not None and self._clock() - kept[0] <= self._trust:
                self.hits += 1
                return kept[1]
            self.misses += 1
            return None

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


def same_version(body: Manifest, other: Manifest) -> bool:
    """The same object at the same resourceVersion."""
    a, b = body.get("metadata") or {}, other.get("metadata") or {}
    return bool(a.get("resourceVersion")) and (a.get("uid"), a.get("resourceVersion")) == (
        b.get("uid"), b.get("resourceVersion"))


def older(body: Manifest, than: Manifest) -> bool:
    """`body` is an older version of the same object than `than` (resourceVersions are etcd revisions;
    one that is not a number, or another uid, counts as newer: the watch's order wins)."""
    a, b = body.get("metadata") or {}, than.get("metadata") or {}
    if a.get("uid") != b.get("uid"):
        return False
    try:
        return int(a.get("resourceVersion", "")) < int(b.get("resourceVersion", ""))
    except ValueError:
        return False

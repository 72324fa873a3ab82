"""The pods of a memfit Job, read once per version of the Job while every one of them is settled.

A routine pass of a running job lists its attempt's pods (their phases, exit reasons, rank 0's address):
at 1,000 jobs the most expensive read of the operator (a ninth of its CPU, py-spy during
benchmarks/scale.py), mostly repeated by passes in which nothing had changed (the resync's progress
looks). A pod that runs or has finished changes in ways that matter only together with its Job: the Job
controller counts it as ready, not ready, terminating, succeeded or failed in the Job's status, which
gives the Job a new resourceVersion. So a list in which every pod is settled (Running, Succeeded or
Failed) is reused while the Job keeps the version it had then, for at most
`trust_seconds` (the same bound as the watched Job itself, controller.watched_jobs). A list with a
pending pod (being scheduled, pulling, waiting for a volume: changes the Job does not count), or with
no pod at all, is never reused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from memfit.controller.watched_jobs import TRUST_SECONDS

Manifest = dict[str, Any]
Version = tuple[str, str]  # the Job's (uid, resourceVersion)
SWEEP_EVERY = 256  # keeps between two sweeps of the lists no longer trusted


def settled(pod: Manifest) -> bool:
    """Running or finished, and not being deleted: what changes next shows in the Job's status. (A
    kubelet reports a pod's address with its first Running status; a simulated pod has none.)"""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") in ("Running", "Succeeded", "Failed")


def job_version(job: Manifest) -> Version | None:
    meta = job.get("metadata") or {}
    uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    return (uid, version) if uid and version else None


class SettledPods:
    """(namespace, label selector) -> the pods listed and the Job version then; thread-safe."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, trust_seconds: float = TRUST_SECONDS
    ) -> None:
        self._clock = clock
        self._trust = trust_seconds
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[float, Version, list[Manifest]]] = {}
        self._keeps = 0
        self.hits = 0

    def get(self, namespace: str, selector: str, job: Manifest) -> list[Manifest] | None:
        """The kept list when it was read at this version of `job` and is still trusted, else None."""
        version = job_version(job)
        with self._lock:
            kept = self._kept.get((namespace, selector))
            if kept is None or version is None or kept[1] != version or self._clock() - kept[0] > self._trust:
                return None
            self.hits += 1
            return kept[2]

    def keep(self, namespace: str, selector: str, job: Manifest, pods: list[Manifest]) -> None:
        """Keep `pods`, read at this version of `job`, when every one is settled; else forget the entry."""
        version = job_version(job)
        now = self._clock()
        with self._lock:
            if version is not None and pods and all(settled(p) for p in pods):
                self._kept[(namespace, selector)] = (now, version, pods)
            else:
                self._kept.pop((namespace, selector), None)
            self._keeps += 1
            if self._keeps % SWEEP_EVERY == 0:  # lists no pass may reuse any more (finished, deleted jobs)
                for key in [k for k, kept in self._kept.items() if now - kept[0] > self._trust]:
                    del self._kept[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

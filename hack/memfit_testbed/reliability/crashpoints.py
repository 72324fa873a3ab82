"""Crash at every write: drive the reconcile in-process and "die" right after its k-th API write.

Random SIGKILLs rarely land between two particular writes; this enumerates them. A clean run of a
lifecycle records its writes; then, for each of them, a fresh job is reconciled with an API that raises
`Crash` (what a SIGKILL at that instant leaves behind) right after the same write (the same
description, the same occurrence of it), and a fresh API (the restarted operator) finishes the job.
Every job must end as the clean run did, with one Job per attempt and status consistent with the
children.

A point is named by the write, not by its index: runs differ in timing (a KWOK pod may finish before a
pass sees it Running, a profiling lifecycle repeats ensures while it waits), so the k-th write of one
run is not the k-th write of another, while "the first `status Succeeded`" is the same point in both.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from memfit.controller.kubeapi import KubeApi
from memfit.controller.reconcile import reconcile_job
from memfit.controller.settings import OperatorSettings

from memfit_testbed.reliability.chaos import GROUP, MOTJ, VERSION, ChaosCluster

SETTINGS = OperatorSettings(trainer_image="memfit-trainer:test")
TERMINAL = ("Succeeded", "Failed")
JOB = "<job>"


class Crash(BaseException):
    """The process died here (BaseException: `except Exception` in the operator must not swallow it)."""


@dataclass
class CrashingApi(KubeApi):
    """KubeApi that records its writes (the job's name shown as `<job>`) and raises `Crash` right after
    the write `crash_at` names: (description, occurrence), occurrence counting from 1."""

    job: str
    crash_at: tuple[str, int] | None = None
    writes: list[str] = field(default_factory=list)

    def _wrote(self, what: str) -> None:
        what = what.replace(self.job, JOB)
        self.writes.append(what)
        if self.crash_at is not None and self.crash_at == (what, self.writes.count(what)):
            raise Crash(what)

    def ensure(self, manifest: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        result = super().ensure(manifest)
        self._wrote(f"ensure {manifest['kind']} {manifest['metadata']['name']}")
        return result

    def replace_config_map_data(self, namespace: str, name: str, data: dict[str, str]) -> None:
        super().replace_config_map_data(namespace, name, data)
        self._wrote(f"patch ConfigMap {name}")

    def delete_job(self, namespace: str, name: str) -> None:
        super().delete_job(namespace, name)
        self._wrote(f"delete Job {name}")

    def patch_motj_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> Any:
        result = super().patch_motj_status(namespace, name, status, resource_version)
        self._wrote(f"status {status.get('phase')}")
        return result

    def create_event(self, event: dict[str, Any]) -> None:
        super().create_event(event)
        self._wrote(f"event {event.get('reason')}")


def crashing(api: KubeApi, job: str, crash_at: tuple[str, int] | None = None) -> CrashingApi:
    return CrashingApi(api.core, api.batch, api.custom, job=job, crash_at=crash_at)


def write_points(writes: list[str]) -> list[tuple[str, int]]:
    """Each write of a clean run as (description, occurrence): the points to crash after."""
    seen: Counter[str] = Counter()
    points = []
    for what in writes:
        seen[what] += 1
        points.append((what, seen[what]))
    return points


def start_crash_runs(cc: ChaosCluster, namespace: str, doc: dict[str, Any], kind: str,
                     writes: list[str]) -> list[Run]:
    """One copy of `doc` per write of its clean run (`<kind>-kNN`), created, each set to crash after it."""
    custom = client.CustomObjectsApi(cc.kube.api_client)
    runs = []
    for k, point in enumerate(write_points(writes), start=1):
        crashed = copy.deepcopy(doc)
        name = crashed["metadata"]["name"] = f"{kind}-k{k:02d}"
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, crashed)
        runs.append(Run(name, crashing(cc.api, name, point)))
    return runs


@dataclass
class Run:
    """One job driven through one crash point."""

    name: str
    api: CrashingApi
    crashed_at: str = ""
    done: bool = False


def drive(cc: ChaosCluster, namespace: str, runs: list[Run], timeout: float) -> None:
    """Reconcile every run's job until terminal; a run whose API crashes continues with a clean API."""
    custom = client.CustomObjectsApi(cc.kube.api_client)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(r.done for r in runs):
        for run in runs:
            if run.done:
                continue
            body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, run.name)
            if (body.get("status") or {}).get("phase") in TERMINAL:
                run.done = True
                continue
            try:
                reconcile_job(run.api, body, settings=SETTINGS)
            except Crash as crash:
                run.crashed_at = str(crash)
                run.api = crashing(run.api, run.name)  # the restarted operator
            except client.exceptions.ApiException as error:
                if error.status != 409:  # a concurrent write: the next round retries, like the operator
                    raise
        time.sleep(0.2)


def count_writes(cc: ChaosCluster, namespace: str, doc: dict[str, Any], timeout: float = 120.0) -> list[str]:
    """The writes of a clean run of `doc` (created under its own name, shown as `<job>`)."""
    custom = client.CustomObjectsApi(cc.kube.api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, doc)
    run = Run(doc["metadata"]["name"], crashing(cc.api, doc["metadata"]["name"]))
    drive(cc, namespace, [run], timeout)
    return run.api.writes

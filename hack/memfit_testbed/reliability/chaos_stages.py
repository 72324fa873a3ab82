"""KWOK stages for chaos runs: hack/kwok/stages.yaml plus a simulated profiler, CUDA OOM and faults.

With these stages the operator's pods need no pod runner (no torch, no CPU):
- a profiling pod completes after `PROFILE_DELAY_MS` with a recorded Profile as its termination
  message;
- a training pod that carries the trainer's fault-injection env (`MEMFIT_INJECT_OOM_AT_STEP`, set from
  the MOTJ annotation `memfit.dev/inject-oom-at-step`) fails with the trainer's OOM exit code and
  termination message;
- by job name (the pods' `MEMFIT_JOB` env): the profiler of a job named `crash-profiler*` exits 1, the
  profiler of `slow-profiler*` never finishes, and the trainer of `long-*` runs until the test ends it
  (`finish_pods` in faults.py), leaving room to inject faults into a running job;
- a running pod that is being deleted (eviction, `kubectl delete`) ends Failed with exit code 143, as
  a kubelet's SIGTERM would end it; the default stages delete it while still Running, so the Job
  controller, which waits for a terminal phase before it replaces a pod, would wait forever.
Every other Job-owned pod completes at once, as in the default stages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from memfit_testbed.paths import REPO

DEFAULT_STAGES = REPO / "hack" / "kwok" / "stages.yaml"
INJECT_ENV = "MEMFIT_INJECT_OOM_AT_STEP"
INJECT_KEY = f'.spec.containers.[].env.[]? | select(.name == "{INJECT_ENV}") | .value'
COMPONENT_KEY = '.metadata.labels["memfit.dev/component"]'
JOB_KEY = '.spec.containers.[].env.[]? | select(.name == "MEMFIT_JOB") | .value'
CRASH_PROFILER, SLOW_PROFILER, LONG_RUN = "crash-profiler", "slow-profiler", "long-"
EXIT_SIGTERM = 143
EXIT_OUT_OF_MEMORY = 87  # memfit_trainer.termination: CUDA out of memory
OOM_PEAK_BYTES = 15 * 2**30
PROFILE_DELAY_MS = 500
RUN_LOCAL_ABSENT = {"key": '.metadata.labels["memfit.dev/run-local"]', "operator": "DoesNotExist"}
NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
RUNNING = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
JOB_OWNED = {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}


def _terminated(phase: str, *, exit_code: int, reason: str, message: str) -> str:
    """A statusTemplate ending every container with this exit code and (single-quoted) message."""
    quoted = "'" + message.replace("'", "''") + "'"
    return (
        "{{ $now := Now }}\n"
        "containerStatuses:\n"
        "{{ range $index, $item := .spec.containers }}\n"
        "- image: {{ $item.image | Quote }}\n"
        "  name: {{ $item.name | Quote }}\n"
        "  ready: false\n"
        "  restartCount: 0\n"
        "  started: false\n"
        "  state:\n"
        "    terminated:\n"
        f"      exitCode: {exit_code}\n"
        "      finishedAt: {{ $now | Quote }}\n"
        f"      reason: {reason}\n"
        f"      message: {quoted}\n"
        "      startedAt: {{ $now | Quote }}\n"
        "{{ end }}\n"
        f"phase: {phase}\n"
    )


def _stage(name: str, expressions: list[dict[str, Any]], template: str, delay_ms: int) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {"matchExpressions": expressions},
            "delay": {"durationMilliseconds": delay_ms},
            "weight": 10000,
            "next": {"statusTemplate": template},
        },
    }


def _job_named(prefix: str, *, match: bool = True) -> dict[str, Any]:
    """The pod's MEMFIT_JOB starts with `prefix` (or does not)."""
    key = f'{JOB_KEY} | startswith("{prefix}")'
    return {"key": key, "operator": "In" if match else "NotIn", "values": ["true"]}


def chaos_stages(profile_json: str, *, oom_step: int = 3) -> list[dict[str, Any]]:
    """The default stages with pod-complete narrowed, plus the profiler, OOM and fault stages."""
    docs = [d for d in yaml.safe_load_all(DEFAULT_STAGES.read_text()) if d]
    for doc in docs:
        if doc["metadata"]["name"] == "pod-complete":
            doc["spec"]["selector"]["matchExpressions"] += [
                {"key": COMPONENT_KEY, "operator": "NotIn", "values": ["profiler"]},
                {"key": INJECT_KEY, "operator": "DoesNotExist"},
                _job_named(LONG_RUN, match=False),
            ]
        if doc["metadata"]["name"] == "pod-delete":  # a running pod is terminated first (below)
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": ".status.phase", "operator": "NotIn", "values": ["Running"]}
            )
    base = [RUN_LOCAL_ABSENT, NOT_DELETED, RUNNING, JOB_OWNED]
    profiler = {"key": COMPONENT_KEY, "operator": "In", "values": ["profiler"]}
    oom = json.dumps({"reason": "CUDAOutOfMemory", "step": oom_step, "peakBytes": OOM_PEAK_BYTES})
    docs.append(
        _stage(
            "memfit-profiler-complete",
            [
                *base,
                profiler,
                _job_named(CRASH_PROFILER, match=False),
                _job_named(SLOW_PROFILER, match=False),
            ],
            _terminated("Succeeded", exit_code=0, reason="Completed", message=profile_json),
            PROFILE_DELAY_MS,
        )
    )
    docs.append(
        _stage(
            "memfit-profiler-crash",
            [*base, profiler, _job_named(CRASH_PROFILER)],
            _terminated("Failed", exit_code=1, reason="Error", message="profiler crashed (injected fault)"),
            200,
        )
    )
    deleting = {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
    docs.append(
        _stage(
            "memfit-pod-terminate",
            [RUN_LOCAL_ABSENT, deleting, RUNNING],
            _terminated("Failed", exit_code=EXIT_SIGTERM, reason="Error", message="terminated (SIGTERM)"),
            100,
        )
    )
    docs.append(
        _stage(
            "memfit-inject-oom",
            [*base, {"key": INJECT_KEY, "operator": "Exists"}],
            _terminated("Failed", exit_code=EXIT_OUT_OF_MEMORY, reason="Error", message=oom),
            200,
        )
    )
    return docs


def write_chaos_stages(path: Path, profile_json: str) -> Path:
    """Write the chaos stages to `path` (for `TestCluster(stages=path)`)."""
    path.write_text(yaml.safe_dump_all(chaos_stages(profile_json), sort_keys=False))
    return path

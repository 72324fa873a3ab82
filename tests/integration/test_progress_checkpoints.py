"""Durable checkpoints and status.progress through the real operator: the job's `<job>-checkpoints` claim
(created by memfit, owned by the job, bound by the test bed's provisioner), progress read from rank 0's
metrics while the trainer runs, and a training pod killed mid-run whose replacement resumes from the
claim (the step counter continues, not from 0)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import (
    create_job,
    get_job,
    quickstart,
    wait_phase,
)
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 600.0
JOB = "progress"
MAX_STEPS = 200
PROGRESS_SECONDS = 2  # the operator's progress reads (15 s by default), often enough for a fast trainer
EVERY = 10


@pytest.fixture(scope="module")
def operator(
    cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Path]:
    env = {"MEMFIT_PROGRESS_SECONDS": str(PROGRESS_SECONDS)}
    with module_operator(cluster, kube, request, tmp_path_factory, env=env) as (log, _):
        yield log


def _progress(kube: Kube, namespace: str) -> dict[str, Any] | None:
    job = get_job(kube, namespace, JOB) or {}
    progress: dict[str, Any] | None = (job.get("status") or {}).get("progress")
    return progress


def _running_trainer(kube: Kube, namespace: str) -> dict[str, Any] | None:
    for pod in kube.pods(namespace, f"memfit.dev/job={JOB},memfit.dev/component=trainer"):
        statuses = pod["status"].get("containerStatuses") or []
        if pod["status"].get("phase") == "Running" and statuses and "running" in statuses[0]["state"]:
            return pod
    return None


def test_progress_advances_and_a_killed_pod_resumes_from_the_checkpoint_claim(
    cluster: Any, kube: Kube, namespace: str, operator: Path
) -> None:
    problem = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 128, "heads": 4, "vocab": 1024, "sequenceLength": 64}}
    training = {"globalBatchSize": 8, "maxSteps": MAX_STEPS, "optimizer": "adamw", "learningRate": 0.001,
                "checkpoint": {"everySteps": EVERY}}  # fmt: skip
    created = create_job(kube, namespace, quickstart(JOB, problem=problem, training=training))
    claim_name = f"{JOB}-checkpoints"

    # The claim exists, owned by the job (the garbage collector deletes it with the job), and is bound.
    claim = kube.wait("the checkpoint claim bound", lambda: _bound(kube, namespace, claim_name), timeout=TIMEOUT)
    owners = claim.metadata.owner_references or []
    assert [(o.kind, o.name, o.uid, o.controller) for o in owners] == [
        ("MemoryOptimizedTrainingJob", JOB, created["metadata"]["uid"], True)
    ], owners
    assert claim.spec.access_modes == ["ReadWriteMany"]
    assert claim.spec.resources.requests["storage"] == "10Gi"  # a tiny GPT's states: the floor
    train_job = kube.wait("the training Job", lambda: _train_job(kube, namespace), timeout=TIMEOUT)
    volumes = {v.name: v for v in train_job.spec.template.spec.volumes}
    assert volumes["checkpoints"].persistent_volume_claim.claim_name == claim_name

    # Kill the training pod's processes after its first checkpoint (like a lost node or a kernel kill).
    # Early in the run, so that the replacement pod runs for many progress reads (PROGRESS_SECONDS apart).
    folder = cluster.workdir / "pod-runner" / "claims" / namespace / claim_name / JOB
    kube.wait("a checkpoint on the claim", lambda: _checkpoint_steps(folder), timeout=TIMEOUT, interval=0.2)
    victim = kube.wait("a running trainer", lambda: _running_trainer(kube, namespace), timeout=60, interval=0.2)
    pid = int(victim["status"]["containerStatuses"][0]["containerID"].removeprefix("memfit-local://"))
    saved = max(_checkpoint_steps(folder) or [0])
    before_kill = _progress(kube, namespace)
    os.killpg(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert saved < MAX_STEPS // 2, saved
    if before_kill is not None:  # a read of the first pod: it started from scratch
        assert before_kill.get("resumedFromStep") is None, before_kill

    # The Job's replacement pod resumes from the claim; status.progress appears and advances while it
    # runs (read from rank 0 every PROGRESS_SECONDS), saying from which step it resumed. Only reads of
    # the running pod count (the final progress comes from its Completed message).
    def resumed(p: dict[str, Any] | None) -> bool:
        return (bool(p) and p.get("resumedFromStep") is not None and "tokensPerSecond" in p  # type: ignore[union-attr]
                and p["step"] < MAX_STEPS)  # type: ignore[index]  # fmt: skip

    first = kube.wait("status.progress of the replacement pod",
                      lambda: p if resumed(p := _progress(kube, namespace)) else None, timeout=TIMEOUT, interval=1)  # fmt: skip
    assert first["maxSteps"] == MAX_STEPS and first["steps"] == f"{first['step']}/{MAX_STEPS}", first
    later = kube.wait(
        "status.progress to advance",
        lambda: p if resumed(p := _progress(kube, namespace)) and p["step"] > first["step"]  # type: ignore[index]
        and p["updatedAt"] != first["updatedAt"] else None, timeout=120, interval=1)  # type: ignore[index]  # fmt: skip
    assert later["loss"] is not None and later["loss"] > 0, later
    assert later["tokensPerSecond"] > 0 and later["stepSeconds"] > 0, later
    assert later["etaSeconds"] >= 0 and later["eta"], later
    job = get_job(kube, namespace, JOB) or {}
    conditions = {c["type"]: c for c in job["status"]["conditions"]}
    assert conditions["CheckpointStorage"]["status"] == "True", conditions
    assert conditions["CheckpointStorage"]["reason"] == "SharedVolume", conditions
    assert job["status"]["checkpointClaim"] == claim_name

    seen: list[dict[str, Any]] = [first, later]

    def resumed_or_done() -> dict[str, Any] | None:
        job = get_job(kube, namespace, JOB) or {}
        status = job.get("status") or {}
        if (p := status.get("progress")) and p.get("resumedFromStep") is not None and p["step"] < MAX_STEPS:
            seen.append(p)
        return job if status.get("phase") in ("Succeeded", "Failed") else None

    kube.wait("the replacement pod to finish", resumed_or_done, timeout=TIMEOUT, interval=1)
    done = wait_phase(kube, namespace, JOB, ("Succeeded", "Failed"), 10, operator)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert [a["outcome"] for a in status["attempts"]] == ["Succeeded"], status["attempts"]  # no re-plan
    progress = status["progress"]
    assert progress["step"] == MAX_STEPS and progress["eta"] == "0s", progress
    assert progress["resumedFromStep"] >= saved >= EVERY, (progress, saved)
    assert progress["tokensPerSecond"] > 0, progress  # the run's rate, from the Completed message
    for p in seen:  # while it ran: the step counter continued from the checkpoint, not from 0
        assert p["resumedFromStep"] == progress["resumedFromStep"] and p["step"] >= p["resumedFromStep"], seen
        assert p.get("loss") is None or p["step"] > p["resumedFromStep"], p
    pods = kube.pods(namespace, f"memfit.dev/job={JOB},memfit.dev/component=trainer")
    finished = [p["status"]["containerStatuses"][0]["state"]["terminated"] for p in pods]
    assert sorted(t["exitCode"] for t in finished) == [0, 137], finished
    message = json.loads(next(t["message"] for t in finished if t["exitCode"] == 0))
    assert message["steps"] == MAX_STEPS and message["resumedFromStep"] == progress["resumedFromStep"], message
    print(f"killed after the step-{saved} checkpoint; resumed at {progress['resumedFromStep']}, done "
          f"{time.monotonic() - killed_at:.0f}s later; {len(seen)} status polls showed the replacement pod's progress; "
          f"final progress {progress}")


def _bound(kube: Kube, namespace: str, name: str) -> Any:
    try:
        claim = kube.core.read_namespaced_persistent_volume_claim(name, namespace)
    except Exception:
        return None
    return claim if claim.status.phase == "Bound" else None


def _train_job(kube: Kube, namespace: str) -> Any:
    jobs = [j for j in kube.batch.list_namespaced_job(namespace).items if j.metadata.name == f"{JOB}-train-0"]
    return jobs[0] if jobs else None


def _checkpoint_steps(folder: Path) -> list[int] | None:
    if not folder.is_dir():
        return None
    steps = [int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if (p / "memfit.json").exists()]
    return steps or None

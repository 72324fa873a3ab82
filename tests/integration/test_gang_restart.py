"""A failed rank of a multi-node plan restarts the whole gang (issue #32, without JobSet): two real trainer
processes (the pod runner, gloo) train a 2-node DDP plan; rank 1 kills itself (SIGKILL) in the first
attempt, after a checkpoint. The training Job's failure policy fails the Job at once and ends rank 0 with
it; memfit records the attempt `RankFailed`, starts the next attempt on the same plan, both ranks resume
from the checkpoint on the job's shared claim, and the run ends where an uninterrupted run of the same
samples ends (the trainer's data is keyed by sample index, so a one-process run with the same global batch
is the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gang_helpers import POOL, gang_pool, terminated, uninterrupted_final_loss
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
__all__ = ["gang_pool", "operator"]  # the fixtures, imported
TIMEOUT = 600.0
JOB = "gang"
MAX_STEPS = 30
EVERY = 5
KILL_AT = 13  # rank 1, after the step-10 checkpoint


def test_a_killed_rank_restarts_both_ranks_from_the_checkpoint_and_the_run_ends_as_uninterrupted(
    kube: Kube, namespace: str, operator: Path, gang_pool: None, tmp_path: Path
) -> None:
    doc = quickstart(JOB, strategy={"engine": "ddp"}, objective={"minimize": "time"},
                     placement={"maxNodes": 2, "nodePools": [POOL]},
                     recovery={"maxReplans": 0, "maxRestarts": 1, "capacityTimeoutSeconds": 300})  # fmt: skip
    doc["spec"]["training"] |= {"maxSteps": MAX_STEPS, "checkpoint": {"everySteps": EVERY}}
    doc["metadata"]["annotations"] = {"memfit.dev/inject-kill-at-step": str(KILL_AT),
                                      "memfit.dev/inject-kill-rank": "1"}  # fmt: skip
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, JOB, ("Succeeded", "Failed"), TIMEOUT, operator)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    attempts = status["attempts"]
    assert [a["outcome"] for a in attempts] == ["RankFailed", "Succeeded"], attempts
    assert [(a["nodes"], a["nodePool"]) for a in attempts] == [(2, POOL), (2, POOL)], attempts
    assert attempts[0]["reason"].startswith("a rank of the 2-node gang failed: "), attempts[0]
    events = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={JOB}").items
    assert "RankFailed" in {e.reason for e in events}

    # Attempt 0: the Job failed on rank 1's exit (its failure policy's FailJob rule), which ended rank 0 too;
    # its pods went with its Job (deleted before attempt 1 started). Attempt 1: both ranks resumed from the
    # step-10 checkpoint and finished.
    reason = attempts[0]["reason"]
    assert "FailJob rule at index 1" in reason and f"{JOB}-train-0-1-" in reason, reason
    pods = kube.pods(namespace, f"memfit.dev/job={JOB},memfit.dev/component=trainer")
    by_attempt: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_attempt.setdefault(pod["metadata"]["labels"]["memfit.dev/attempt"], []).append(pod)
    assert all(p["status"].get("phase") != "Running" for p in by_attempt.get("0", [])), by_attempt.get("0")
    finished = [terminated(p) for p in by_attempt["1"]]
    assert sorted(t["exitCode"] for t in finished if t) == [0, 0], finished
    message = json.loads(next(t["message"] for t in finished if t and t.get("message")))
    assert message["steps"] == MAX_STEPS and message["resumedFromStep"] == 10, message

    # The same samples in one uninterrupted process: the gang's final loss.
    plan_doc = kube.core.read_namespaced_config_map(f"{JOB}-plan-1", namespace).data["plan.json"]
    reference = uninterrupted_final_loss(json.loads(plan_doc), tmp_path)
    assert message["finalLoss"] == pytest.approx(reference, rel=1e-4), (message, reference)

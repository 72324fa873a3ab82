"""A node of a running 2-node plan is lost (issue #32): two real trainer processes (the pod runner, gloo)
train a 2-node DDP plan and stall at a step after a checkpoint; the test drains rank 1's node (cordon, then
evict its pod through the Eviction API, as `kubectl drain` does). The pod's DisruptionTarget condition fails
the training Job at once, memfit records the attempt `RankDisrupted` and re-plans onto the capacity left --
one node, the same global batch -- and the one rank resumes from the 2-rank checkpoint (resharded) and ends
where an uninterrupted run of the same samples ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gang_helpers import POOL, gang_pool, terminated, uninterrupted_final_loss
from kubernetes import client
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
__all__ = ["gang_pool", "operator"]  # the fixtures, imported
TIMEOUT = 600.0
JOB = "nodeloss"
MAX_STEPS = 30
EVERY = 5
HOLD_AT = 13  # both ranks stall here in the first attempt, after the step-10 checkpoint


def test_a_drained_node_replans_the_gang_onto_the_node_left_and_resumes_resharded(
    cluster: Any, kube: Kube, namespace: str, operator: Path, gang_pool: None, tmp_path: Path
) -> None:
    # Torch's AdamW: DCP reshards its state to the new world size, so the resumed run continues the curve
    # exactly (an 8-bit optimizer's state resumes only at the same world size: across a re-plan to fewer
    # nodes the weights carry over and the optimizer restarts; docs/trainer.md).
    doc = quickstart(JOB, strategy={"engine": "ddp", "optimizer8bit": "disabled"}, objective={"minimize": "time"},
                     placement={"maxNodes": 2, "nodePools": [POOL]},
                     # A disruption is a re-plan, not a restart: none allowed, and the job still succeeds.
                     recovery={"maxReplans": 1, "maxRestarts": 0, "capacityTimeoutSeconds": 60})  # fmt: skip
    doc["spec"]["training"] |= {"maxSteps": MAX_STEPS, "checkpoint": {"everySteps": EVERY}}
    doc["metadata"]["annotations"] = {"memfit.dev/inject-hold-at-step": str(HOLD_AT)}
    create_job(kube, namespace, doc)
    folder = cluster.workdir / "pod-runner" / "claims" / namespace / f"{JOB}-checkpoints" / JOB
    kube.wait("the step-10 checkpoint of the 2-node attempt", lambda: 10 in _checkpoint_steps(folder) or None,
              timeout=TIMEOUT, interval=0.5)  # fmt: skip
    rank1 = kube.wait("rank 1 running", lambda: _running_rank(kube, namespace, 1), timeout=60, interval=0.5)
    node = rank1["spec"]["nodeName"]
    kube.core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=rank1["metadata"]["name"], namespace=namespace))
        kube.core.create_namespaced_pod_eviction(rank1["metadata"]["name"], namespace, eviction)
        job = wait_phase(kube, namespace, JOB, ("Succeeded", "Failed"), TIMEOUT, operator)
    finally:
        kube.core.patch_node(node, {"spec": {"unschedulable": None}})
    status = job["status"]
    assert status["phase"] == "Succeeded", json.dumps(status.get("attempts"), indent=1)
    attempts = status["attempts"]
    assert [a["outcome"] for a in attempts] == ["RankDisrupted", "Succeeded"], attempts
    assert [(a["nodes"], a["nodePool"]) for a in attempts] == [(2, POOL), (1, POOL)], attempts
    assert attempts[0]["reason"].startswith("a rank of the 2-node gang was disrupted"), attempts[0]
    assert "DisruptionTarget" in attempts[0]["reason"], attempts[0]
    events = kube.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={JOB}").items
    assert "RankDisrupted" in {e.reason for e in events}
    # The re-plan keeps the global batch (one GPU accumulates what two did) and says so.
    plan = json.loads(kube.core.read_namespaced_config_map(f"{JOB}-plan-1", namespace).data["plan.json"])
    assert plan["nodes"] == 1 and plan["microBatchSize"] * plan["gradientAccumulationSteps"] == 8, plan
    replanned = [e.message for e in events if e.reason == "Replanning"]
    assert any("keeps the effective global batch 8" in m for m in replanned), replanned
    pods = kube.pods(namespace, f"memfit.dev/job={JOB},memfit.dev/component=trainer,memfit.dev/attempt=1")
    finished = [terminated(p) for p in pods]
    assert [t["exitCode"] for t in finished if t] == [0], finished
    message = json.loads(next(t["message"] for t in finished if t and t.get("message")))
    assert message["steps"] == MAX_STEPS and message["resumedFromStep"] == 10, message
    assert message["finalLoss"] == pytest.approx(uninterrupted_final_loss(plan, tmp_path), rel=1e-4), message


def _checkpoint_steps(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return [int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if (p / "memfit.json").exists()]


def _running_rank(kube: Kube, namespace: str, index: int) -> dict[str, Any] | None:
    selector = f"memfit.dev/job={JOB},memfit.dev/component=trainer,memfit.dev/attempt=0"
    for pod in kube.pods(namespace, selector):
        labels = pod["metadata"]["labels"]
        if labels.get("batch.kubernetes.io/job-completion-index") == str(index) and pod["status"].get("phase") == "Running":
            return pod
    return None

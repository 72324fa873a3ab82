"""A failed rank of a multi-node plan restarts the whole gang (issue #32, without JobSet): two real trainer
processes (the pod runner, gloo) train a 2-node DDP plan; rank 1 kills itself (SIGKILL) in the first
attempt, after a checkpoint. The training Job's failure policy fails the Job at once and ends rank 0 with
it; memfit records the attempt `RankFailed`, starts the next attempt on the same plan, both ranks resume
from the checkpoint on the job's shared claim, and the run ends where an uninterrupted run of the same
samples ends (the trainer's data is keyed by sample index, so a one-process run with the same global batch
is the reference)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 600.0
JOB = "gang"
MAX_STEPS = 30
EVERY = 5
KILL_AT = 13  # rank 1, after the step-10 checkpoint
POOL = "gang-t4"
# The t4-spot KWOK nodes as a pool whose "GPU" is slow (0.5 GB/s of memory bandwidth: the tiny GPT is
# otherwise bound by kernel launches, where a second GPU cannot shorten a step) and whose network is fast:
# two nodes are the fastest plan (objective: time).
GANG_POOL = {
    "apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool", "metadata": {"name": POOL},
    "spec": {"gpu": {"product": "Tesla-T4", "memoryMiB": 15360, "perNode": 1, "memoryBandwidthGBps": 0.5},
             "nodeSelector": {"memfit.dev/pool": "t4-spot"},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "pricePerNodeHour": 0.22, "capacityType": "on-demand", "maxNodes": 2,
             "interconnect": {"intraNode": "nvlink", "interNodeGbps": 3200}}}  # fmt: skip


@pytest.fixture(scope="module")
def operator(
    cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Path]:
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, _):
        yield log


@pytest.fixture
def gang_pool(kube: Kube) -> Iterator[None]:
    """The pool exists only for this test: other modules' jobs must not plan onto it."""
    custom = client.CustomObjectsApi(kube.api_client)
    custom.create_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools", GANG_POOL)
    try:
        yield
    finally:
        custom.delete_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools", POOL)


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
    finished = [_terminated(p) for p in by_attempt["1"]]
    assert sorted(t["exitCode"] for t in finished if t) == [0, 0], finished
    message = json.loads(next(t["message"] for t in finished if t and t.get("message")))
    assert message["steps"] == MAX_STEPS and message["resumedFromStep"] == 10, message

    # The same samples in one uninterrupted process: the gang's final loss.
    plan_doc = kube.core.read_namespaced_config_map(f"{JOB}-plan-1", namespace).data["plan.json"]
    reference = _uninterrupted_final_loss(json.loads(plan_doc), tmp_path)
    assert message["finalLoss"] == pytest.approx(reference, rel=1e-4), (message, reference)


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = pod["status"].get("containerStatuses") or []
    return statuses[0].get("state", {}).get("terminated") if statuses else None


def _uninterrupted_final_loss(plan: dict[str, Any], tmp: Path) -> float:
    """The attempt's plan at world size 1 with the same global batch, trained from scratch by the trainer's
    CLI in a subprocess (gloo, CPU)."""
    accumulation = plan["gradientAccumulationSteps"] * plan["nodes"] * plan["gpusPerNode"]
    one = {**plan, "nodes": 1, "gpusPerNode": 1, "gradientAccumulationSteps": accumulation, "attempt": 0}
    one.pop("checkpointDir", None)
    path = tmp / "plan.json"
    path.write_text(json.dumps(one))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MEMFIT_", "PET_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    termination = tmp / "termination-log"
    env |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MEMFIT_TERMINATION_MESSAGE_PATH": str(termination),
            "MEMFIT_CHECKPOINT_DIR": str(tmp / "ckpt")}
    proc = subprocess.run([sys.executable, "-m", "memfit_trainer.cli", "train", "--plan", str(path)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    loss = json.loads(termination.read_text())["finalLoss"]
    assert isinstance(loss, float)
    return loss

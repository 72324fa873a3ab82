"""Pod and Job summaries: OOM detection, unschedulable time, termination messages."""

from __future__ import annotations

import json
from typing import Any

from memfit.lifecycle.observed import summarize_job, summarize_pod


def pod(phase: str = "Running", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p-0"}, "status": {"phase": phase, **status}}


def terminated(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    return {
        "containerStatuses": [
            {
                "name": "trainer",
                "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}},
            }
        ]
    }


def test_cuda_oom_from_termination_message() -> None:
    msg = json.dumps({"reason": "CUDAOutOfMemory", "peakBytes": 123, "step": 3, "rank": 0})
    summary = summarize_pod(pod("Failed", **terminated(87, message=msg)))
    assert summary.out_of_memory == "CUDAOutOfMemory" and summary.peak_bytes == 123


def test_oom_killed_is_host_oom() -> None:
    assert summarize_pod(pod("Failed", **terminated(137, "OOMKilled"))).out_of_memory == "HostOutOfMemory"


def test_plain_failure_is_not_oom() -> None:
    summary = summarize_pod(pod("Failed", **terminated(1, message="boom")))
    assert summary.out_of_memory is None and summary.raw_message == "boom" and summary.message == {}


def test_unschedulable_since() -> None:
    cond = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": "2026-12-01T10:00:00Z",
        "message": "0/3 nodes are available",
    }
    summary = summarize_pod(pod("Pending", conditions=[cond]))
    assert summary.unschedulable_since is not None and summary.unschedulable_since.hour == 10
    assert "0/3" in summary.unschedulable_message


def test_job_conditions() -> None:
    job = {
        "metadata": {"name": "j"},
        "spec": {"suspend": True},
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": "Container trainer exited with 87",
                }
            ]
        },
    }
    summary = summarize_job(job, [], "j")
    assert summary.failed and summary.failure_reason == "PodFailurePolicy" and summary.suspended
    assert not summarize_job(None, [], "j").exists


def test_a_failed_init_container_is_named_with_its_image() -> None:
    """The pod never ran its main container: the failure names the init container that exited, not the
    user's container."""
    pod = {
        "metadata": {"name": "j-train-0-abc"},
        "spec": {"containers": [{"name": "trainer", "image": "user/train:1"}]},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {"name": "memfit-config", "image": "memfit/trainer:dev",
                 "state": {"terminated": {"exitCode": 1, "reason": "Error"}}},
            ],
            "containerStatuses": [
                {"name": "trainer", "image": "user/train:1", "state": {"waiting": {"reason": "PodInitializing"}}},
            ],
        },
    }
    detail = summarize_pod(pod).exit_detail()
    assert detail.startswith("pod j-train-0-abc's init container memfit-config exited 1 (Error)")
    assert "(image memfit/trainer:dev)" in detail and "user/train" not in detail

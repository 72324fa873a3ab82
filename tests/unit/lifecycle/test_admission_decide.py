"""decide_workload: one Workload's snapshot -> the check states to set and the Event on its Job, as
effects the controller applies with the MOTJ reconcile's own apply_writes (no cluster)."""

from __future__ import annotations

from typing import Any

import yaml
from memfit.catalog import CATALOG
from memfit.lifecycle.admission import WorkloadSnapshot, decide_workload, problem_config_map
from memfit.lifecycle.result import PostEvent, SetAdmissionCheck
from test_memory_fit import GPT2, LLAMA_1B, POOLS


def workload(gpus: int = 1, flavor: str = "t4-spot") -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "metadata": {"name": "job-x-1", "namespace": "team-a",
                     "ownerReferences": [{"kind": "Job", "name": "x", "uid": "u-1"}]},
        "spec": {"podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}]},
        "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "count": 1, "flavors": {"nvidia.com/gpu": flavor}}]}},
    }


def problem(config: dict[str, Any]) -> dict[str, str]:
    doc = {"apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": "x"},
           "spec": {"problem": {"huggingface": {"model": "org/m", "config": config, "sequenceLength": 1024}},
                    "training": {"globalBatchSize": 8}}}
    return {"job.yaml": yaml.safe_dump(doc)}


JOB = {"metadata": {"name": "x", "annotations": {"memfit.dev/problem": "x-problem"}}}


def snapshot(**changes: Any) -> WorkloadSnapshot:
    base: dict[str, Any] = dict(workload=workload(), pending_checks=("memory-fit",), owner={"name": "x", "uid": "u-1"},
                                job=JOB, problem=problem(GPT2), flavor_labels={}, pools=POOLS, queue_pools=POOLS,
                                catalog=CATALOG, now="2026-12-05T00:00:00Z")  # fmt: skip
    return WorkloadSnapshot(**(base | changes))


def test_a_fitting_job_sets_ready_on_every_pending_check_and_posts_nothing() -> None:
    decision = decide_workload(snapshot(pending_checks=("memory-fit", "memory-fit-b")))
    assert decision is not None and decision.verdict.state == "Ready"
    assert [(e.check, e.state) for e in decision.effects if isinstance(e, SetAdmissionCheck)] == [
        ("memory-fit", "Ready"), ("memory-fit-b", "Ready")]
    assert not any(isinstance(e, PostEvent) for e in decision.effects)
    assert decision.effects[0].namespace == "team-a" and decision.effects[0].workload == "job-x-1"


def test_a_rejection_is_also_an_event_on_the_job() -> None:
    decision = decide_workload(snapshot(problem=problem(LLAMA_1B)))
    assert decision is not None and decision.verdict.state == "Rejected"
    check, event = decision.effects
    assert isinstance(check, SetAdmissionCheck) and check.state == "Rejected"
    assert isinstance(event, PostEvent) and event.reason == "MemoryFitRejected" and event.type.value == "Warning"
    assert event.involved == {"apiVersion": "batch/v1", "kind": "Job", "name": "x", "namespace": "team-a", "uid": "u-1"}


def test_a_missing_problem_config_map_is_retry_and_an_unseen_job_is_looked_at_again() -> None:
    retry = decide_workload(snapshot(problem=None))
    assert retry is not None and retry.verdict.state == "Retry" and "ConfigMap x-problem" in retry.verdict.message
    assert decide_workload(snapshot(job=None)) is None


def test_jobs_memfit_launched_or_without_the_annotation_are_not_checked() -> None:
    mine = {"metadata": {"name": "x", "labels": {"app.kubernetes.io/managed-by": "memfit"}}}
    assert problem_config_map(mine) == "" and problem_config_map(JOB) == "x-problem"
    decision = decide_workload(snapshot(job=mine))
    assert decision is not None and decision.verdict.state == "Ready" and "launched by memfit" in decision.verdict.message
    plain = decide_workload(snapshot(job={"metadata": {"name": "x"}}))
    assert plain is not None and "no memfit.dev/problem annotation" in plain.verdict.message
    foreign = decide_workload(snapshot(owner=None, job=None))
    assert foreign is not None and foreign.verdict.state == "Ready" and not any(
        isinstance(e, PostEvent) for e in foreign.effects)

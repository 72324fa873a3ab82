"""memfit as a Kueue AdmissionCheck (`memfit.dev/memory-fit`) for Jobs memfit did not launch: the real
Kueue v0.19.1 manager, the operator process with the check controller on, plain batch Jobs on KWOK pools.

A ClusterQueue lists the check. A Job annotated `memfit.dev/problem: <ConfigMap>` whose declared
strategy cannot fit the flavor Kueue reserved is Rejected with memfit's message and never runs; a fitting
one and an unannotated one are admitted; a missing ConfigMap is answered Retry, naming it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kueue_helpers import admitted, apply, delete, kwok_gpunodepools, queued_job, running_pod, workload_of
from memfit.kube.kueue import build_kueue_setup
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.kueue import KueueManager
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
T4 = {"memfit.dev/pool": "t4-spot"}
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}


@pytest.fixture(scope="module")
def operator(
    cluster: Any, kube: Kube, kueue: KueueManager, tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Path]:
    with module_operator(cluster, kube, request, tmp_path_factory,
                         env={"MEMFIT_ADMISSION_CHECK_SECONDS": "1"}) as (log, _):
        yield log


def _problem(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A ConfigMap with the MemoryOptimizedTrainingJob manifest the check reads (DDP declared)."""
    job = {"apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": name},
           "spec": {"problem": {"huggingface": {"model": f"org/{name}", "config": config, "sequenceLength": 1024}},
                    "training": {"globalBatchSize": 8}, "strategy": {"engine": "ddp"}}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"job.yaml": yaml.safe_dump(job)}}


def _annotated(name: str, problem: str | None) -> dict[str, Any]:
    job = queued_job(name, "gpu", T4)
    if problem:
        job["metadata"]["annotations"] = {"memfit.dev/problem": problem}
    return job


def _job_event(kube: Kube, ns: str, job: str, reason: str) -> str | None:
    """The message of memfit's Event `reason` on Job `job` (the check state itself is reset by Kueue on eviction)."""
    events = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={job}").items
    return next((e.message for e in events if e.reason == reason and e.involved_object.kind == "Job"), None)


def _workload_event(kube: Kube, ns: str, job: str, reason: str) -> str | None:
    """The message of Kueue's Event `reason` on the Workload of Job `job`."""
    wl = workload_of(kube, ns, job)
    if wl is None:
        return None
    events = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={wl['metadata']['name']}").items
    return next((e.message for e in events if e.reason == reason), None)


def test_memory_fit_check_rejects_what_cannot_fit_and_admits_what_fits(
    kube: Kube, namespace: str, operator: Path
) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(kube.api_client)
    check_name = f"memory-fit-{namespace}"
    pools = kwok_gpunodepools()
    docs = build_kueue_setup(pools, cluster_queue=f"cq-{namespace}", local_queue="gpu", namespace=namespace,
                             gpu_quota={"t4-spot": 4, "l4-ondemand": 4})
    docs[-2]["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": check_name}]}
    check = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": check_name},
             "spec": {"controllerName": "memfit.dev/memory-fit"}}
    apply([check, *docs])
    try:
        # memfit activates its AdmissionCheck; Kueue then activates the ClusterQueue.
        def active() -> dict[str, Any] | None:
            obj = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", check_name)
            cond = condition(obj, "Active")
            return cond if cond and cond["status"] == "True" else None

        kube.wait("AdmissionCheck Active", active, timeout=30)
        for cm in (_problem("llama-1b", LLAMA_1B), _problem("gpt2", GPT2)):
            kube.core.create_namespaced_config_map(namespace, cm)
        kube.batch.create_namespaced_job(namespace, _annotated("too-big", "llama-1b"))
        kube.batch.create_namespaced_job(namespace, _annotated("fits", "gpt2"))
        kube.batch.create_namespaced_job(namespace, _annotated("unchecked", None))
        kube.batch.create_namespaced_job(namespace, _annotated("no-config", "not-there"))

        # memfit answers Rejected; Kueue deactivates the Workload within milliseconds and resets the check
        # to Pending, so the answer is read where it stays: memfit's Event on the Job and Kueue's on the Workload.
        message = kube.wait("too-big Rejected",
                            lambda: _job_event(kube, namespace, "too-big", "MemoryFitRejected"), timeout=90)
        kueue_says = kube.wait("Kueue's AdmissionCheckRejected event",
                               lambda: _workload_event(kube, namespace, "too-big", "AdmissionCheckRejected"), timeout=30)
        assert message in kueue_says, (message, kueue_says)
        assert message.startswith("needs "), message
        assert "(DDP fp16 mbs 1x8 on 1 GPU(s), 1 per pod, incl. 10 percent headroom)" in message
        assert "flavor t4-spot (Tesla-T4) has 15.0 GiB" in message
        assert "fits on flavor" in message and "t4-spot as declared" not in message

        ready = kube.wait("fits admitted", lambda: admitted(kube, namespace, "fits"), timeout=60)
        fit = next(c for c in ready["status"]["admissionChecks"] if c["name"] == check_name)
        assert fit["state"] == "Ready" and fit["message"].startswith("fits: needs "), fit
        kube.wait("fits runs on a T4 node", lambda: running_pod(kube, namespace, "fits"), timeout=60)
        unchecked = kube.wait("unannotated admitted", lambda: admitted(kube, namespace, "unchecked"), timeout=60)
        assert any("memory fit not checked" in c["message"] for c in unchecked["status"]["admissionChecks"])

        # A missing ConfigMap is answered Retry (Kueue evicts and requeues; memfit names what is missing).
        def retried() -> bool:
            return ("Retry: ConfigMap not-there (annotation memfit.dev/problem of Job no-config) not found in "
                    f"namespace {namespace}") in operator.read_text()

        kube.wait("no-config answered Retry", retried, timeout=60)
        assert "not found in namespace" in (_job_event(kube, namespace, "no-config", "MemoryFitRetry") or "")

        # The rejected Job never ran: Kueue deactivated its Workload, the Job stays suspended, no pod.
        time.sleep(3)
        assert kube.batch.read_namespaced_job("too-big", namespace).spec.suspend is True
        assert not kube.pods(namespace, "job-name=too-big")
        wl = workload_of(kube, namespace, "too-big")
        assert wl is not None and wl["spec"].get("active") is False, wl
        assert (condition(wl, "Admitted") or {}).get("status") != "True", wl["status"]
    finally:
        for job in ("too-big", "fits", "unchecked", "no-config"):
            kube.batch.delete_namespaced_job(job, namespace, propagation_policy="Background")
        delete(docs[-2:])
        delete([check])

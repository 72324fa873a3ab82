"""A failed job gives its GPUs back, on a real kubelet: after each failure path the job's pods are gone
within one resync of its end and the pool's free GPUs are back (lifecycle/release.py, issue #28).

The four failure paths run side by side in one namespace (one profile, measured once by a warm-up job,
serves the ones that train), so the tier pays for the slowest path, not the sum:
- no-secret: the pretrained weights come from the hub with a token Secret that does not exist: the
  training pod's download step sits in CreateContainerConfigError holding its GPU until the job fails
  (ContainerConfigError) and memfit deletes the training Job (the case a user hit);
- no-image: the image cannot be pulled: the profiling pod holds its GPU until the job fails
  (ImageUnavailable) and memfit deletes the profiling Job;
- exhausted: an out-of-memory with `maxReplans: 0` (ReplansExhausted): the attempt's Job is deleted by
  the re-plan step that finds no re-plan left (lifecycle/decide.py), not by the release;
- nofit: no pool fits `maxCostPerHour`: the job fails at planning and never creates a training Job."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from memfit_testbed.realnode.node import RealNode

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

HOLDING = ("Pending", "Running")  # a pod in these phases holds (or waits for) its nvidia.com/gpu
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}


def _failure_paths() -> dict[str, tuple[dict[str, Any], str]]:
    """job name -> (manifest, the Failed reason it must end with)."""
    secret = quickstart("no-secret", recovery={"capacityTimeoutSeconds": 20, "maxReplans": 3})
    secret["spec"]["problem"] = {"huggingface": {"model": "org/tiny-llama", "tokenSecretRef": {"name": "absent-token"},
                                                 "initialize": "pretrained", "sequenceLength": 64,
                                                 "config": TINY_LLAMA}}
    image = quickstart("no-image", recovery={"capacityTimeoutSeconds": 20, "maxReplans": 3})
    image["spec"]["image"] = "memfit.invalid/memfit-trainer:absent"
    exhausted = quickstart("exhausted", recovery={"capacityTimeoutSeconds": 60, "maxReplans": 0})
    exhausted["metadata"]["annotations"] = {"memfit.dev/inject-oom-at-step": "2"}
    exhausted["spec"]["training"]["maxSteps"] = 200
    nofit = quickstart("nofit", objective={"minimize": "cost", "maxCostPerHour": 0.01})
    return {
        "no-secret": (secret, "ContainerConfigError"),
        "no-image": (image, "ImageUnavailable"),
        "exhausted": (exhausted, "ReplansExhausted"),
        "nofit": (nofit, "NoFit"),
    }


def pods_of(kube: Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    return [p for p in kube.pods(namespace) if p["metadata"].get("labels", {}).get("memfit.dev/job") == job]


def _pool(kube: Kube, name: str) -> dict[str, Any]:
    pool: dict[str, Any] = client.CustomObjectsApi(kube.api_client).get_cluster_custom_object(
        "memfit.dev", "v1alpha1", "gpunodepools", name)
    return pool.get("status") or {}


def _unfinished_jobs(kube: Kube, namespace: str, job: str) -> list[str]:
    return [j.metadata.name for j in kube.batch.list_namespaced_job(namespace, label_selector=f"memfit.dev/job={job}").items
            if not any(c.type in ("Complete", "Failed") and c.status == "True" for c in (j.status.conditions or []))]


def test_every_failure_path_gives_the_gpus_back(
        rkube: Kube, operator: Path, rnode: RealNode, rnamespace: Callable[..., str]) -> None:
    ns = rnamespace()
    create_job(rkube, ns, quickstart("warm"))  # measures the quickstart profile the trained paths reuse
    wait_phase(rkube, ns, "warm", ("Succeeded",), timeout=300, operator_log=operator)
    paths = _failure_paths()
    for doc, _ in paths.values():
        create_job(rkube, ns, doc)
    held: dict[str, bool] = {}  # did the job ever have a pod holding a GPU (the path is not vacuous)
    released: dict[str, float] = {}  # seconds from Failed to no pod holding a GPU
    failed_at: dict[str, float] = {}
    deadline = time.monotonic() + 420
    while len(released) < len(paths) and time.monotonic() < deadline:
        for name in paths:
            pods = pods_of(rkube, ns, name)
            holding = [p["metadata"]["name"] for p in pods if p.get("status", {}).get("phase") in HOLDING]
            held[name] = held.get(name, False) or bool(holding)
            job = client.CustomObjectsApi(rkube.api_client).get_namespaced_custom_object(
                "memfit.dev", "v1alpha1", ns, "memoryoptimizedtrainingjobs", name)
            if (job.get("status") or {}).get("phase") == "Failed":
                failed_at.setdefault(name, time.monotonic())
                if not holding and not _unfinished_jobs(rkube, ns, name) and name not in released:
                    released[name] = time.monotonic() - failed_at[name]
        time.sleep(0.5)
    custom = client.CustomObjectsApi(rkube.api_client)
    for name, (_, reason) in paths.items():
        status = custom.get_namespaced_custom_object("memfit.dev", "v1alpha1", ns, "memoryoptimizedtrainingjobs",
                                                     name)["status"]
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert (status["phase"], failed["reason"]) == ("Failed", reason), (name, status)
        assert name in released, f"{name}: pods still hold GPUs {sorted(p['metadata']['name'] for p in pods_of(rkube, ns, name))}"
        # One resync is 1 s in the test operator; the release pass runs right after Failed is stored.
        assert released[name] < 15, (name, released[name])
    assert held["no-secret"] and held["no-image"] and held["exhausted"], held
    # The release said so (the Event comes after the status write, from a background thread: wait on it).
    for name, child in (("no-secret", "no-secret-train-0"), ("no-image", "no-image-profile")):
        rkube.wait(f"a GPUsReleased Event on {name} naming {child}", lambda name=name, child=child: any(
            e.reason == "GPUsReleased" and child in (e.message or "")
            for e in rkube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items),
            timeout=30)
    # The record stays: the plan ConfigMap of the job that trained; NoFit never created a training Job.
    plan = rkube.core.read_namespaced_config_map("exhausted-plan-0", ns)
    assert "plan.json" in (plan.data or {})
    assert not held["nofit"] and not [j.metadata.name for j in rkube.batch.list_namespaced_job(ns).items
                                      if j.metadata.name.startswith("nofit-train")]
    # The pool's free GPUs are back (pods of earlier tests may still be terminating: wait on the state).
    rkube.wait("every GPU of t4-spot free again",
               lambda: (lambda s: s.get("freeGpus") == s.get("allocatableGpus", 0) > 0 or None)(_pool(rkube, "t4-spot")),
               timeout=60)

"""A job running its own script (spec.container) on the real node: the example's plain PyTorch loop
(examples/own-code/train_loop.py, delivered by a ConfigMap through spec.podTemplate) runs as a container
started by the real kubelet, with the DeepSpeed config memfit's init container writes beside it, under the
restricted Pod Security level, and is profiled there under memfit's probe first. The image is the node's trainer image standing in for the user's (no
registry is reachable here; any image with torch and DeepSpeed would do)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart
from memfit_testbed.own_code_cases import LOOP, LOOP_PINS
from memfit_testbed.realnode.node import RealNode
from realnode_jobs import run_to_end, terminated

pytestmark = [pytest.mark.realnode, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "own-code" / "train_loop.py"
WORKSPACE = {
    "volumes": [{"name": "workspace", "configMap": {"name": "own-loop"}}],
    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace", "readOnly": True}],
    "env": [{"name": "MEMFIT_DEVICE", "value": "cpu"}],  # the node's "GPU" is its CPU: DeepSpeed's CPU config
}


def test_a_script_with_memfits_deepspeed_config_runs_as_a_real_container_and_succeeds(
        rkube: Kube, operator: Path, rnode: RealNode, rnamespace: Callable[..., str]) -> None:
    assert rnode.images is not None
    ns = rnamespace({"pod-security.kubernetes.io/enforce": "restricted"})
    rkube.core.create_namespaced_config_map(ns, {"metadata": {"name": "own-loop"},
                                                "data": {"train_loop.py": SCRIPT.read_text()}})
    container = {**LOOP, "image": rnode.images.trainer, "honors": ["deepspeedConfig"]}
    # fp32 pinned: DeepSpeed refuses fp16 on a CPU, which the probe would run on the simulated T4 (no bf16).
    create_job(rkube, ns, quickstart("own-ds", container=container, podTemplate=WORKSPACE, strategy={**LOOP_PINS, "precision": "fp32"}))
    job, seen = run_to_end(rkube, ns, "own-ds", 400, operator)
    assert job["status"]["phase"] == "Succeeded", "\n".join([
        f"{job['status'].get('phase')}: {job['status'].get('message')}",
        *(f"{name} {c['name']}: {json.dumps(c.get('state'))[-1500:]}" for name, p in seen.items()
          for c in (p["status"].get("initContainerStatuses") or []) + (p["status"].get("containerStatuses") or []))])
    plan = job["status"]["plan"]
    trainers = [p for name, p in seen.items() if "-train-" in name and terminated(p).get("exitCode") == 0]
    assert trainers, sorted(seen)
    for pod in trainers:
        assert pod["spec"]["nodeName"] == rnode.node_name
        assert terminated(pod)["containerID"].startswith("containerd://")
        assert pod["spec"]["containers"][0]["image"] == rnode.images.trainer
        written = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}["memfit-config"]
        assert written["state"]["terminated"]["exitCode"] == 0
    reported = json.loads(next(terminated(p)["message"] for p in trainers if terminated(p).get("message")))
    assert reported["engine"] == "deepspeed" and plan["engine"] == "deepspeed", (reported, plan)
    assert (reported["micro_batch"], reported["accumulation"], reported["world"]) == (
        plan["microBatchSize"], plan["gradientAccumulationSteps"], plan["gpus"])
    assert reported["micro_batch"] * reported["accumulation"] * reported["world"] == 8  # the global batch
    assert reported["steps"] == 20
    # Run under the probe's monitor (a real container of the image, its bundle from memfit-probe): memfit's
    # Completed peaks beside the script's own keys.
    assert reported["reason"] == "Completed" and reported["peakBytes"] > 0 and reported["memoryMeter"], reported
    # Profiled as a real container too: memfit's profiler (init), then the script in its image under the probe,
    # from the bundle memfit's init container copied in, with the DeepSpeed config rewritten per micro-batch.
    [profiling] = [p for name, p in seen.items() if "-profile-" in name]
    ended = {c["name"]: c["state"].get("terminated") or {} for c in profiling["status"]["initContainerStatuses"]
             + profiling["status"]["containerStatuses"]}
    assert [ended[n].get("exitCode") for n in ("memfit-probe", "memfit-config", "profiler", "probe")] == [0, 0, 0, 0]
    assert ended["probe"]["containerID"].startswith("containerd://")
    probe = json.loads(ended["probe"]["message"])
    assert probe["findings"] == [] and [p["fedMicroBatch"] for p in probe["points"]] == [1, 2], probe

"""memfit on a real node: profiler and trainer pods run as containers of the trainer image built from
trainer-image/Dockerfile, started by a real kubelet through containerd (docs/realnode.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed import kwok_pools
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from memfit_testbed.realnode.node import NODE_IP, POD_CIDR, RealNode
from realnode_jobs import pods_of, run_to_end, terminated

pytestmark = [pytest.mark.realnode, pytest.mark.slow]


def test_node_is_a_real_kubelet_with_containerd(rkube: Kube, rnode: RealNode) -> None:
    node = rkube.raw(rkube.core.read_node, rnode.node_name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.3"
    assert info["containerRuntimeVersion"].startswith("containerd://1.")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(rnode.gpus)
    assert node["metadata"]["labels"]["memfit.dev/pool"] == rnode.pool
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    # The real node replaced its pool's KWOK nodes; the other pools stay simulated.
    assert kwok_pools.pool_nodes(rkube.core, rnode.pool) == [rnode.node_name]
    assert kwok_pools.pool_nodes(rkube.core, "l4-ondemand") == ["l4-ondemand-0", "l4-ondemand-1"]


PROBE = """
import json, socket, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
req = urllib.request.Request("https://kubernetes.default.svc/version",
                             headers={"Authorization": "Bearer " + open(sa + "/token").read()})
out = {"dns": socket.gethostbyname("kubernetes.default.svc.cluster.local"),
       "api": json.load(urllib.request.urlopen(req, context=ctx, timeout=20))["gitVersion"]}
import torch
out["torch"] = torch.__version__
open("/dev/termination-log", "w").write(json.dumps(out))
raise SystemExit(3)
"""


def test_restricted_pod_reaches_dns_and_the_api_and_reports_its_termination_message(
        rkube: Kube, rnode: RealNode, rnamespace: Callable[..., str]) -> None:
    """A pod of the trainer image under Pod Security `restricted`: a bridge IP, cluster DNS (CoreDNS), the
    API server through the `kubernetes` ClusterIP (kube-proxy) with its service-account token, and the
    termination message and exit code written by the kubelet."""
    ns = rnamespace({"pod-security.kubernetes.io/enforce": "restricted"})
    assert rnode.images is not None
    rkube.core.create_namespaced_pod(ns, {
        "metadata": {"name": "probe"},
        "spec": {
            "restartPolicy": "Never", "nodeSelector": {"memfit.dev/pool": rnode.pool},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            # A writable /tmp under the read-only root, as memfit's own pods have: importing torch needs one
            # (it imports dill, which asks tempfile for a usable directory at import time).
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "containers": [{
                "name": "probe", "image": rnode.images.trainer, "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-c", PROBE], "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}}]}})
    pod = rkube.wait_pod_phase(ns, "probe", ("Failed", "Succeeded"), timeout=120)
    state = terminated(pod)
    log = rkube.core.read_namespaced_pod_log("probe", ns)[-3000:] if state.get("exitCode") != 3 else ""
    assert pod["status"]["phase"] == "Failed" and state["exitCode"] == 3, f"{state}\n{log}"
    assert state["containerID"].startswith("containerd://")
    assert pod["status"]["podIP"].startswith(POD_CIDR.rsplit(".", 2)[0])
    assert pod["status"]["hostIP"] == NODE_IP
    seen = json.loads(state["message"])
    assert seen == {"dns": "10.0.0.1", "api": "v1.36.3", "torch": seen["torch"]}
    assert seen["torch"].startswith("2.15.0"), "the image's torch is constraints.txt's"


def test_quickstart_runs_as_real_containers(rkube: Kube, operator: Path, rnode: RealNode,
                                            rnamespace: Callable[..., str]) -> None:
    ns = rnamespace()
    create_job(rkube, ns, quickstart("quickstart"))
    job, seen = run_to_end(rkube, ns, "quickstart", 300, operator)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    pods = list(seen.values())
    assert {p["spec"]["nodeName"] for p in pods} == {rnode.node_name}
    trainer = [p for p in pods if "-train-" in p["metadata"]["name"] and terminated(p)]
    assert trainer, [p["metadata"]["name"] for p in pods]
    state = terminated(trainer[-1])
    assert state["containerID"].startswith("containerd://") and state["exitCode"] == 0
    message = json.loads(state["message"])
    assert message["reason"] == "Completed" and message["steps"] == 20, message


def test_profiler_crash_fails_the_job_with_its_termination_message(
        rkube: Kube, operator: Path, rnamespace: Callable[..., str]) -> None:
    """The profiler container exits non-zero; the kubelet carries its termination message (an error
    Profile) into the pod status, and memfit fails the job naming the cause."""
    ns = rnamespace()
    doc = quickstart("crash")
    doc["spec"]["problem"] = {"entrypoint": "memfit_missing_module.problems:build"}
    create_job(rkube, ns, doc)
    job, seen = run_to_end(rkube, ns, "crash", 240, operator)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "ProfilingFailed", failed
    assert "No module named 'memfit_missing_module'" in failed["message"]
    pods = [p for p in seen.values() if terminated(p)]
    assert pods and all(terminated(p)["exitCode"] != 0 for p in pods)
    profile = json.loads(terminated(pods[0])["message"])
    assert "memfit_missing_module" in profile["error"]


def test_memory_limit_gives_a_real_oomkilled_and_a_replan(
        rkube: Kube, operator: Path, rnamespace: Callable[..., str]) -> None:
    """A LimitRange gives the trainer container a 200 MiB limit (below what torch alone needs): the kernel
    kills it, the kubelet reports OOMKilled, memfit records HostOutOfMemory and re-plans."""
    ns = rnamespace()
    # Profile first, without the limit (the cached profile makes the second job skip profiling).
    create_job(rkube, ns, quickstart("warm"))
    wait_phase(rkube, ns, "warm", ("Succeeded",), timeout=300, operator_log=operator)
    rkube.core.create_namespaced_limit_range(ns, {
        "metadata": {"name": "small-memory"},
        "spec": {"limits": [{"type": "Container", "default": {"memory": "200Mi"},
                             "defaultRequest": {"memory": "100Mi"}}]}})
    create_job(rkube, ns, quickstart("oom"))
    oom_seen: list[str] = []
    deadline = time.monotonic() + 300
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        oom_seen += [p["metadata"]["name"] for p in pods_of(rkube, ns, "oom")
                     if terminated(p).get("reason") == "OOMKilled"]
        job = client.CustomObjectsApi(rkube.api_client).get_namespaced_custom_object(
            "memfit.dev", "v1alpha1", ns, "memoryoptimizedtrainingjobs", "oom")
        attempts = (job.get("status") or {}).get("attempts") or []
        if oom_seen and len(attempts) >= 2:
            break
        time.sleep(0.5)
    assert oom_seen, f"no OOMKilled container; status {job.get('status')}"
    attempts = job["status"]["attempts"]
    assert attempts[0]["outcome"] == "OutOfMemory", attempts
    assert "HostOutOfMemory" in attempts[0]["reason"] and "t4-spot" in attempts[0]["reason"]
    assert len(attempts) >= 2, "memfit re-planned after the OOM"


def test_pod_deleted_mid_run_resumes_from_the_pvc_checkpoint(
        rkube: Kube, operator: Path, rnode: RealNode, rnamespace: Callable[..., str]) -> None:
    """Checkpoints go to a PersistentVolumeClaim (a hostPath PV on the node); the training pod is deleted
    after a checkpoint, the Job's replacement pod resumes from it and finishes."""
    ns = rnamespace()
    folder = rnode.local_volume(ns, "ckpt")
    doc = quickstart("resume")
    # Enough steps that the pod is still training when it is deleted after its second checkpoint.
    doc["spec"]["training"].update(maxSteps=300, checkpoint={"volumeClaim": "ckpt", "everySteps": 10})
    create_job(rkube, ns, doc)
    rkube.wait("a checkpoint at step 20 on the volume",
               lambda: (folder / "resume" / "step-00000020").exists() or None, timeout=240)
    victim = next(p for p in pods_of(rkube, ns, "resume") if "-train-" in p["metadata"]["name"])
    victim_name = victim["metadata"]["name"]
    rkube.core.delete_namespaced_pod(victim_name, ns, grace_period_seconds=0)
    job, seen = run_to_end(rkube, ns, "resume", 600, operator)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    finished = [terminated(p) for name, p in seen.items() if "-train-" in name and name != victim_name]
    done = [t for t in finished if t.get("exitCode") == 0]
    assert done, f"no replacement pod finished; pods seen: {sorted(seen)}"
    message = json.loads(done[0]["message"])
    assert message["steps"] == 300 and message["resumedFromStep"] >= 20, message


REAL_FAST_POOL = {
    "apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool", "metadata": {"name": "real-fast"},
    # The node's "GPU" is its CPU: 0.5 GB/s of memory bandwidth says how slow (the quickstart's tiny model is
    # otherwise bound by kernel launches on a T4, where a second GPU cannot make a step shorter), and a fast
    # interconnect makes two nodes the fastest plan (objective: time).
    "spec": {"gpu": {"product": "Tesla-T4", "memoryMiB": 15360, "perNode": 1, "memoryBandwidthGBps": 0.5},
             "nodeSelector": {"memfit.dev/real-node": "true"},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "pricePerNodeHour": 0.22, "capacityType": "on-demand", "maxNodes": 2,
             "interconnect": {"intraNode": "nvlink", "interNodeGbps": 3200}}}


def test_two_pod_ddp_rendezvous_through_the_headless_service_dns(
        rkube: Kube, operator: Path, rnode: RealNode, rnamespace: Callable[..., str]) -> None:
    """A world-size-2 DDP job: two pods of the Indexed Job on the node's bridge, rank 1 finds rank 0 by the
    headless Service's DNS name (CoreDNS), gloo all-reduces between the two containers."""
    custom = client.CustomObjectsApi(rkube.api_client)
    try:
        custom.create_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools", REAL_FAST_POOL)
    except client.exceptions.ApiException as e:
        if e.status != 409:
            raise
    ns = rnamespace()
    doc = quickstart("ddp2", strategy={"engine": "ddp"}, objective={"minimize": "time"},
                     placement={"maxNodes": 2, "nodePools": ["real-fast"]})
    doc["spec"]["training"]["maxSteps"] = 10
    create_job(rkube, ns, doc)
    job, seen = run_to_end(rkube, ns, "ddp2", 400, operator)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    trainers = [p for p in seen.values() if "-train-" in p["metadata"]["name"]]
    assert len(trainers) == 2, [p["metadata"]["name"] for p in trainers]
    env = {e["name"]: e.get("value") for e in trainers[0]["spec"]["containers"][0]["env"]}
    assert env["PET_MASTER_ADDR"] == "ddp2-train-0-0.ddp2" and env["PET_NNODES"] == "2"
    assert len({p["status"]["podIP"] for p in trainers}) == 2
    for pod in trainers:
        assert terminated(pod)["exitCode"] == 0 and terminated(pod)["containerID"].startswith("containerd://")


def test_an_image_that_cannot_be_pulled_fails_the_job_naming_the_image(
        rkube: Kube, operator: Path, rnamespace: Callable[..., str]) -> None:
    """No registry is reachable: the kubelet's pull of an image that is not on the node fails
    (ErrImagePull, then ImagePullBackOff). memfit shows the image and the cause while it waits, and
    fails the job after `recovery.capacityTimeoutSeconds` instead of waiting silently."""
    ns = rnamespace()
    image = "memfit.invalid/memfit-trainer:absent"
    doc = quickstart("noimage")
    doc["spec"]["image"] = image
    doc["spec"]["recovery"] = {"capacityTimeoutSeconds": 30}
    create_job(rkube, ns, doc)
    job, _ = run_to_end(rkube, ns, "noimage", 180, operator)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "ImageUnavailable", failed
    assert image in failed["message"] and ("ErrImagePull" in failed["message"]
                                           or "ImagePullBackOff" in failed["message"]), failed

"""The reliability campaign on the real node: real containers, the same invariants.

A few MOTJ lifecycles (profiler and trainer running as containers of the trainer image on the real
kubelet, docs/realnode.md) while the operator (a host process, as in the real-node tier) is
SIGKILLed at random moments and restarted. Then every invariant of the KWOK campaign is checked on
the namespace (`invariants.check_world`: nothing stuck, no duplicate training Job, no orphan, status
consistent with the children, every lifecycle Succeeded with one attempt), every MOTJ is deleted and
garbage collection must leave nothing behind, and the node must leave no host change behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import apply_pools, create_job, quickstart, start_operator, stop_operator
from memfit_testbed.realnode.cluster import real_node_cluster
from memfit_testbed.realnode.node import unsupported_reason
from memfit_testbed.reliability.chaos import install_crds
from memfit_testbed.reliability.gpu_occupancy import GpuOccupancy, waited_on_busy_gpus
from memfit_testbed.reliability.invariants import JobRecorder, check_world, leftovers

NAMESPACE = "realnode-chaos"
TERMINAL = ("Succeeded", "Failed")


def run_real_node_campaign(work: Path, *, lifecycles: int, kills: int, seed: int = 15,
                           timeout: float = 900.0) -> dict[str, Any]:
    """Run the campaign; {"skipped": reason} where the machine cannot run a real node."""
    reason = (os.environ.get("MEMFIT_SKIP_REALNODE") and "MEMFIT_SKIP_REALNODE is set") or unsupported_reason()
    if reason:
        return {"skipped": reason}
    workdir = work / "realnode-cluster"
    workdir.mkdir(parents=True, exist_ok=True)
    with real_node_cluster(workdir) as (cluster, node, ready):
        install_crds(cluster.kubeconfig)
        kube = Kube(config.new_client_from_config(config_file=str(cluster.kubeconfig)),
                    lambda: cluster.log_tail(30))
        apply_pools(kube)
        assert node.images is not None
        result = _campaign(kube, cluster.kubeconfig, node.images.trainer, work, lifecycles, kills, seed, timeout)
        result["node_ready_seconds"] = round(ready, 1)
        return result


def _campaign(kube: Kube, kubeconfig: Path, image: str, work: Path, lifecycles: int, kills: int, seed: int,
              timeout: float) -> dict[str, Any]:
    rng = random.Random(seed)
    kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
    kube.wait("default SA", lambda: kube.raw(kube.core.read_namespaced_service_account, "default", NAMESPACE), 60)
    recorder = JobRecorder(kube, NAMESPACE).start()
    occupancy = GpuOccupancy(kube).start()
    capacity_timeout = int(quickstart("x")["spec"]["recovery"]["capacityTimeoutSeconds"])
    log = work / "operator-realnode.log"
    names = [f"rn-{i}" for i in range(lifecycles)]
    operator = _operator(kubeconfig, image, log)
    done_kills = in_flight_kills = crashes = 0
    started = time.monotonic()
    try:
        for name in names:
            create_job(kube, NAMESPACE, quickstart(name))
        next_kill = time.monotonic() + rng.uniform(2.0, 8.0)
        while time.monotonic() - started < timeout:
            phases = _phases(kube, names)
            if all(p in TERMINAL for p in phases.values()) and done_kills >= kills:
                break
            if operator.poll() is not None:  # it died on its own: a crash, counted, and restarted
                crashes += 1
                operator = _operator(kubeconfig, image, log)
            if done_kills < kills and time.monotonic() >= next_kill:
                in_flight_kills += any(p not in TERMINAL for p in phases.values())
                operator.send_signal(signal.SIGKILL)
                operator.wait()
                done_kills += 1
                operator = _operator(kubeconfig, image, log)
                next_kill = time.monotonic() + rng.uniform(2.0, 8.0)
            time.sleep(0.5)
        seconds = round(time.monotonic() - started, 1)
        # More lifecycles than the node has GPUs: a job whose neighbours held every GPU for the
        # quickstart's capacityTimeoutSeconds is re-planned (NoCapacity), as documented.
        report = check_world(kube, NAMESPACE, recorder=recorder,
                             expected={n: ("Succeeded", ["Succeeded"]) for n in names},
                             explain=lambda _, status: waited_on_busy_gpus(occupancy, capacity_timeout, status))
        custom = client.CustomObjectsApi(kube.api_client)
        for name in names:
            custom.delete_namespaced_custom_object("memfit.dev", "v1alpha1", NAMESPACE,
                                                   "memoryoptimizedtrainingjobs", name)
        deadline = time.monotonic() + 120
        left = leftovers(kube, NAMESPACE)
        while left and time.monotonic() < deadline:
            time.sleep(1.0)
            left = leftovers(kube, NAMESPACE)
    finally:
        occupancy.stop()
        recorder.stop()
        stop_operator(operator)
    return report.summary() | {
        "runtime": f"containerd (real kubelet), image {image}",
        "lifecycles": lifecycles,
        "sigkills": done_kills,
        "sigkills_with_jobs_in_flight": in_flight_kills,
        "operator_crashes": crashes,
        "seconds_to_all_terminal": seconds,
        "orphans_after_delete": len(left),
        "orphan_examples": left[:5],
    }


def _operator(kubeconfig: Path, image: str, log: Path) -> subprocess.Popen[bytes]:
    """`memfit operator` as a host process without the pod-runner label: its pods go to the real node."""
    proc, _ = start_operator(kubeconfig, log, "--namespace", NAMESPACE, pod_runner=False, trainer_image=image)
    return proc


def _phases(kube: Kube, names: list[str]) -> dict[str, str]:
    custom = client.CustomObjectsApi(kube.api_client)
    out: dict[str, str] = {}
    for name in names:
        obj = kube.raw(custom.get_namespaced_custom_object, "memfit.dev", "v1alpha1", NAMESPACE,
                       "memoryoptimizedtrainingjobs", name) or {}
        out[name] = str((obj.get("status") or {}).get("phase") or "")
    return out

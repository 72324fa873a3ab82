"""The operator in-cluster: `helm install` of charts/memfit with the locally built operator image, under Pod
Security `restricted`, on the real node; it drives the quickstart and survives its own pod being deleted
mid-launch without duplicating a Job (docs/realnode.md)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed import testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, get_job, quickstart, wait_phase
from memfit_testbed.realnode.node import RealNode

pytestmark = [pytest.mark.realnode, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "memfit"
OPERATOR_VALUES = REPO / "hack" / "realnode" / "operator-values.yaml"
NS = "memfit-system"


def helm(cluster: testcluster.TestCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(cluster.workdir / "helm"),
           "HELM_CONFIG_HOME": str(cluster.workdir / "helm"), "HELM_DATA_HOME": str(cluster.workdir / "helm")}
    result = subprocess.run([str(testcluster.find_bin_dir() / "helm"), *args], env=env, capture_output=True,
                            text=True, check=False, timeout=300)
    assert not check or result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def helm_operator(real_cluster: Any, rkube: Kube, rnode: RealNode, rcrds: None) -> Iterator[str]:
    cluster, _ = real_cluster
    rkube.core.create_namespace({"metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    # The values of docs/realnode.md: the committed file puts the operator on the real node (not a KWOK node)
    # and leaves the CRDs to rcrds; the node's images file names the images it holds.
    helm(cluster, "install", "memfit", str(CHART), "-n", NS, "--wait", "--timeout", "180s",
         "-f", str(OPERATOR_VALUES), "-f", str(rnode.images_values),
         "--set-json", 'operator.extraArgs=["--resync-seconds","1"]')
    try:
        yield NS
    finally:
        helm(cluster, "uninstall", "memfit", "-n", NS, "--wait", check=False)
        rkube.core.delete_namespace(NS)


def operator_pods(kube: Kube) -> list[dict[str, Any]]:
    return [p for p in kube.pods(NS) if p["metadata"]["name"].startswith("memfit-")
            and not p["metadata"].get("deletionTimestamp")]


def test_operator_pod_runs_restricted_on_the_real_node(rkube: Kube, rnode: RealNode, helm_operator: str) -> None:
    pods = operator_pods(rkube)
    assert len(pods) == 1 and pods[0]["spec"]["nodeName"] == rnode.node_name
    status = pods[0]["status"]["containerStatuses"][0]
    assert status["ready"] and status["containerID"].startswith("containerd://")
    assert pods[0]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_in_cluster_operator_runs_the_quickstart_and_survives_its_pod_deleted_mid_launch(
        rkube: Kube, helm_operator: str) -> None:
    name, ns = "helm-quickstart", "rn-helm"
    rkube.core.create_namespace({"metadata": {"name": ns}})
    rkube.wait("default ServiceAccount", lambda: rkube.raw(rkube.core.read_namespaced_service_account,
                                                          "default", ns), timeout=30)
    try:
        create_job(rkube, ns, quickstart(name))
        rkube.wait("profiling", lambda: (get_job(rkube, ns, name) or {}).get("status", {}).get("phase")
                   in ("Profiling", "Launching", "Running") or None, timeout=120)
        victim = operator_pods(rkube)[0]["metadata"]["name"]
        rkube.core.delete_namespaced_pod(victim, NS)
        rkube.wait("a new operator pod Ready", lambda: [
            p for p in operator_pods(rkube) if p["metadata"]["name"] != victim
            and all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])] or None, timeout=180)
        job = wait_phase(rkube, ns, name, ("Succeeded", "Failed"), timeout=400)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        jobs = sorted(j.metadata.name for j in rkube.batch.list_namespaced_job(ns).items)
        assert jobs == [f"{name}-profile", f"{name}-train-0"], jobs  # no duplicate, no second attempt
    finally:
        rkube.core.delete_namespace(ns)
        time.sleep(1)

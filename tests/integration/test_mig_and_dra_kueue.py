"""Kueue quota for GPUs by memory (issue #33 item 3), with the real Kueue manager, KWOK nodes, the real
scheduler and the operator.

MIG: a KWOK H100 node in NVIDIA's `mixed` strategy (one whole GPU, seven 1g.10gb and two 3g.40gb slices)
and a pool per kind of device; `memfit kueue flavors` gives each pool's flavor quota in its own resource
(`nvidia.com/mig-1g.10gb`...). Another team holds the queue's only 1g.10gb slice: memfit reads the slice
quota, plans the small job onto a 3g.40gb slice (the next cheapest with quota), and Kueue admits both
children on that flavor.

DRA: a pool whose GPUs are claimed through DeviceClass gpu.nvidia.com (the test bed's stand-in driver
publishes the devices), Kueue configured as `memfit kueue flavors` says (`deviceClassMappings`: the class
charged as `nvidia.com/gpu`). A Job holding one device by claim uses the flavor's whole quota; the memfit
job waits in Planning naming that quota, and trains on the pool once the device is given back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kueue_helpers import GPU_TOLERATION, KWOK_KEEP_RUNNING, admitted, apply, delete, queued_job, workload_of
from memfit.api.pool import GPUNodePool
from memfit.controller.kubeapi import KubeApi
from memfit.kube.kueue import LABEL_QUEUE, build_kueue_setup, device_class_mappings
from memfit_testbed import dra_driver
from memfit_testbed.cluster_helpers import Kube, condition
from memfit_testbed.kwok_pools import Gpu, MigSlices, Pool, delete_pool, scale_pool
from memfit_testbed.operator_helpers import create_job, get_job, quickstart, wait_phase
from memfit_testbed.profiles import seed_profile
from operator_ready import kueue_operator

__all__ = ["kueue_operator"]  # the module operator fixture (registered as `operator`), imported
pytestmark = [pytest.mark.cluster, pytest.mark.slow]
GROUP, VERSION = "memfit.dev", "v1alpha1"
H100 = "NVIDIA-H100-80GB-HBM3"
MIG_NODES, DRA_NODES = "h100-mig-q", "h100-dra-q"  # the KWOK nodes' memfit.dev/pool label
TIMEOUT = 300.0


def _pool(name: str, nodes: str, **gpu: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNodePool", "metadata": {"name": name},
            "spec": {"gpu": {"product": H100, "perNode": 1, **gpu}, "nodeSelector": {"memfit.dev/pool": nodes},
                     "pricePerNodeHour": 6.88, "maxNodes": 1,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}


MIG_POOLS = [_pool("q-whole", MIG_NODES), _pool("q-1g", MIG_NODES, mig={"profile": "1g.10gb"}),
             _pool("q-3g", MIG_NODES, mig={"profile": "3g.40gb", "perGPU": 2})]
DRA_POOL = _pool("q-dra", DRA_NODES, dra={"deviceClassName": dra_driver.GPU_CLASS})
# What `memfit kueue flavors` prints for the DRA pool, as Kueue's Configuration (tests/unit/kube/test_mig_kueue.py)
KUEUE_DEVICE_CLASS_MAPPINGS = device_class_mappings([GPUNodePool.model_validate(DRA_POOL)])


@pytest.fixture(scope="module")
def pools(kube: Kube, operator: Path) -> Iterator[None]:
    """The MIG node and the DRA node with their devices, and the four pools; gone after the module."""
    slices = (MigSlices("1g.10gb", 7, 9856), MigSlices("3g.40gb", 2, 40192))
    scale_pool(kube.core, Pool(name=MIG_NODES, nodes=1, instance_type="p5.48xlarge", capacity_type="on-demand",
                               cpu="16", memory="64Gi", gpu=Gpu(product=H100, memory_mib=81559, count=1, mig=slices)), 1)
    (dra_node,) = scale_pool(kube.core, Pool(name=DRA_NODES, nodes=1, instance_type="p5.48xlarge",
                                             capacity_type="on-demand", cpu="16", memory="64Gi"), 1)
    dra_driver.install(kube.api_client, {dra_node: [dra_driver.Device("gpu-0", memory_mib=81920)]})
    custom = client.CustomObjectsApi(kube.api_client)
    for doc in (*MIG_POOLS, DRA_POOL):
        custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", doc)
    try:
        yield
    finally:
        for doc in (*MIG_POOLS, DRA_POOL):
            custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodepools", doc["metadata"]["name"])
        dra_driver.uninstall(kube.api_client, [dra_node])
        delete_pool(kube.core, MIG_NODES)
        delete_pool(kube.core, DRA_NODES)


def _setup(ns: str, pools: list[dict[str, Any]], quota: dict[str, int]) -> list[dict[str, Any]]:
    docs = build_kueue_setup([GPUNodePool.model_validate(p) for p in pools], cluster_queue=f"cq-{ns}",
                             local_queue="gpu", namespace=ns, gpu_quota=quota)
    apply(docs)
    return docs


def _flavors(kube: Kube, ns: str, job: str) -> dict[str, str]:
    wl = workload_of(kube, ns, job)
    assert wl is not None, f"no Workload for {job}"
    return dict(wl["status"]["admission"]["podSetAssignments"][0]["flavors"])


def test_with_its_slice_quota_taken_a_job_plans_onto_the_next_slice_flavor_with_quota(
    kube: Kube, namespace: str, operator: Path, pools: None
) -> None:
    docs = _setup(namespace, MIG_POOLS, {"q-whole": 1, "q-1g": 1, "q-3g": 2})
    try:
        other = queued_job("other-team", "gpu", {"memfit.dev/pool": MIG_NODES})
        other["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
        kube.batch.create_namespaced_job(namespace, other)
        wl = kube.wait("the other team's slice admitted", lambda: admitted(kube, namespace, "other-team"), timeout=60)
        assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"] == {"nvidia.com/mig-1g.10gb": "q-1g"}

        create_job(kube, namespace, quickstart("next-slice", scheduling={"kueueQueue": "gpu"},
                                               placement={"maxNodes": 1, "nodePools": ["q-whole", "q-1g", "q-3g"]}))
        job = wait_phase(kube, namespace, "next-slice", ("Succeeded", "Failed"), TIMEOUT, operator)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        plan = job["status"]["plan"]
        assert (plan["nodePool"], plan["gpuProduct"]) == ("q-3g", f"{H100}-MIG-3g.40gb"), plan
        for child in ("next-slice-profile", "next-slice-train-0"):
            flavors = _flavors(kube, namespace, child)
            assert flavors["nvidia.com/mig-3g.40gb"] == "q-3g" and set(flavors.values()) == {"q-3g"}, (child, flavors)
            pods = kube.pods(namespace, f"job-name={child}")
            assert pods and all(p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
                                for p in pods), child
    finally:
        with contextlib.suppress(client.ApiException):
            kube.batch.delete_namespaced_job("other-team", namespace, propagation_policy="Background")
        delete(docs[-2:])


def _reserved(kube: Kube, cq: str) -> bool:
    """Whether ClusterQueue `cq` reports one nvidia.com/gpu reserved on flavor q-dra."""
    status = client.CustomObjectsApi(kube.api_client).get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", cq).get("status") or {}
    return any(r.get("name") == "nvidia.com/gpu" and str(r.get("total")) == "1"
               for f in status.get("flavorsReservation") or [] if f.get("name") == "q-dra" for r in f.get("resources") or [])


def _claimed_job(name: str, device_class: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A queued Job whose KWOK pod holds one device of `device_class` by claim (and requests no extended
    resource): Kueue can only charge it through deviceClassMappings."""
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": f"{name}-gpu"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}]}}}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": {LABEL_QUEUE: "gpu"}},
           "spec": {"suspend": True, "template": {"metadata": {"annotations": KWOK_KEEP_RUNNING}, "spec": {
               "restartPolicy": "Never", "nodeSelector": {"memfit.dev/pool": DRA_NODES}, "tolerations": [GPU_TOLERATION],
               "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"{name}-gpu"}],
               "containers": [{"name": "main", "image": "memfit/fake:1", "resources": {"claims": [{"name": "gpu"}]}}]}}}}
    return template, job


def test_dra_devices_count_against_the_flavor_s_quota_and_a_job_waits_for_it(
    kube: Kube, namespace: str, operator: Path, pools: None
) -> None:
    docs = _setup(namespace, [DRA_POOL], {"q-dra": 1})
    custom = client.CustomObjectsApi(kube.api_client)
    template, holder = _claimed_job("holder", dra_driver.GPU_CLASS)
    custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaimtemplates", template)
    try:
        kube.batch.create_namespaced_job(namespace, holder)
        wl = kube.wait("the claim-holding Job admitted", lambda: admitted(kube, namespace, "holder"), timeout=60)
        assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == "q-dra"
        assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]["nvidia.com/gpu"] == "1"
        # What memfit reads: the ClusterQueue's reservation, which Kueue writes after admitting the Workload.
        kube.wait("the ClusterQueue's reservation of the claimed device", lambda: _reserved(kube, f"cq-{namespace}"),
                  timeout=60)

        spec = quickstart("by-claim-q", scheduling={"kueueQueue": "gpu"}, placement={"maxNodes": 1, "nodePools": ["q-dra"]})
        seed_profile(KubeApi.from_client(kube.api_client), namespace, spec)  # no profiling Job to wait in the queue
        create_job(kube, namespace, spec)

        def waiting() -> dict[str, Any] | None:
            cond = condition(get_job(kube, namespace, "by-claim-q"), "Planned")
            return cond if cond and "q-dra 0/1" in cond.get("message", "") else None

        cond = kube.wait("the memfit job waiting for the DRA quota", waiting, timeout=90)
        assert (cond["status"], cond["reason"]) == ("False", "WaitingForCapacity"), cond
        assert "ClusterQueue cq-" in cond["message"] and "GPU quota free/nominal: q-dra 0/1" in cond["message"]
        assert not kube.batch.list_namespaced_job(namespace, label_selector="memfit.dev/job=by-claim-q").items

        kube.batch.delete_namespaced_job("holder", namespace, propagation_policy="Background")
        job = wait_phase(kube, namespace, "by-claim-q", ("Succeeded", "Failed"), TIMEOUT, operator)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        assert job["status"]["plan"]["nodePool"] == "q-dra"
        assert _flavors(kube, namespace, "by-claim-q-train-0")["nvidia.com/gpu"] == "q-dra"
    finally:
        with contextlib.suppress(client.ApiException):  # deleted above once the test got that far
            kube.batch.delete_namespaced_job("holder", namespace, propagation_policy="Background")
        delete(docs[-2:])

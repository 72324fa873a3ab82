"""GPUs by claim (issue #33, DRA): a GPUNodePool with `gpu.dra` over two KWOK nodes whose devices a stand-in
for NVIDIA's DRA driver publishes as ResourceSlices (memfit_testbed.dra_driver): node 0 holds one device
with 128 MiB of memory, node 1 one with 80 GiB. memfit gives the profiling and training Jobs a
ResourceClaimTemplate (one device of the pool's DeviceClass; the training one also requires the plan's
predicted peak plus headroom of device memory), Kubernetes makes a claim per pod, and the real scheduler
allocates it: the trainer can only land on node 1. The job Succeeds; the pool's status counts the devices
from the slices. A pool naming a DeviceClass that does not exist is not planned on, and the job says so
naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed import dra_driver
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.kwok_pools import Pool, delete_pool, scale_pool
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import operator

__all__ = ["operator"]  # the module operator fixture, imported
pytestmark = [pytest.mark.cluster, pytest.mark.slow]
GROUP, VERSION = "memfit.dev", "v1alpha1"
NODE_POOL = "h100-dra"
POOL = "h100-claims"
TIMEOUT = 300.0


def _pool(name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNodePool", "metadata": {"name": name},
            "spec": {"gpu": {"product": "NVIDIA-H100-80GB-HBM3", "perNode": 1, "dra": {"deviceClassName": device_class}},
                     "nodeSelector": {"memfit.dev/pool": NODE_POOL}, "pricePerNodeHour": 6.88, "maxNodes": 2}}



@pytest.fixture(scope="module")
def dra_nodes(kube: Kube, operator: Path) -> Iterator[list[str]]:
    """Two KWOK nodes without any nvidia.com resource, their ResourceSlices and the DeviceClasses."""
    nodes = scale_pool(kube.core, Pool(name=NODE_POOL, nodes=2, instance_type="p5.48xlarge",
                                       capacity_type="on-demand", cpu="16", memory="64Gi"), 2)
    dra_driver.install(kube.api_client, {
        nodes[0]: [dra_driver.Device("gpu-0", memory_mib=128)],
        nodes[1]: [dra_driver.Device("gpu-0", memory_mib=81920)],
    })
    try:
        yield nodes
    finally:
        dra_driver.uninstall(kube.api_client, nodes)
        delete_pool(kube.core, NODE_POOL)


@pytest.fixture
def pool(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    name, device_class = request.param
    custom = client.CustomObjectsApi(kube.api_client)
    custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", _pool(name, device_class))
    try:
        yield name
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodepools", name)


@pytest.mark.parametrize("pool", [(POOL, dra_driver.GPU_CLASS)], indirect=True)
def test_a_job_on_a_dra_pool_gets_a_device_with_the_memory_its_plan_needs(
    kube: Kube, namespace: str, operator: Path, dra_nodes: list[str], pool: str
) -> None:
    doc = quickstart("by-claim", placement={"maxNodes": 1, "nodePools": [pool]})
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, "by-claim", ("Succeeded", "Failed"), TIMEOUT, operator)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    plan = job["status"]["plan"]
    assert (plan["nodePool"], plan["gpus"]) == (pool, 1)

    trainer = kube.pods(namespace, "memfit.dev/job=by-claim,memfit.dev/component=trainer")
    assert len(trainer) == 1
    spec = trainer[0]["spec"]
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "by-claim-train-0-gpus"}]
    container = spec["containers"][0]
    assert container["resources"].get("claims") == [{"name": "gpus"}]
    assert not any(k.startswith("nvidia.com/") for k in (container["resources"].get("limits") or {}))
    # Only node 1's device has the memory the plan needs: the scheduler allocated it there.
    assert spec["nodeName"] == dra_nodes[1], spec["nodeName"]

    custom = client.CustomObjectsApi(kube.api_client)
    template = custom.get_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaimtemplates",
                                                   "by-claim-train-0-gpus")
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (exactly["deviceClassName"], exactly["count"]) == (dra_driver.GPU_CLASS, 1)
    floor = exactly["selectors"][0]["cel"]["expression"]
    assert floor.startswith('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("'), floor
    assert template["metadata"]["ownerReferences"][0]["name"] == "by-claim"

    status = custom.get_cluster_custom_object(GROUP, VERSION, "gpunodepools", pool).get("status", {})
    assert status.get("allocatableGpus") == 2, status


@pytest.mark.parametrize("pool", [("no-class", "no-such-class.example.com")], indirect=True)
def test_a_pool_whose_device_class_does_not_exist_is_not_planned_on(
    kube: Kube, namespace: str, operator: Path, dra_nodes: list[str], pool: str
) -> None:
    doc = quickstart("no-class", placement={"maxNodes": 1, "nodePools": [pool]})
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, "no-class", ("Failed",), TIMEOUT, operator)
    messages = " ".join(c.get("message", "") for c in job["status"].get("conditions", []))
    assert "gpu.dra.deviceClassName 'no-such-class.example.com' is not a DeviceClass" in messages, messages
    assert not kube.pods(namespace, "memfit.dev/job=no-class,memfit.dev/component=trainer")


@pytest.mark.parametrize("pool", [("small-devices", dra_driver.GPU_CLASS)], indirect=True)
def test_a_claim_no_device_can_hold_ends_the_attempt_no_capacity_with_the_schedulers_words(
    kube: Kube, namespace: str, operator: Path, dra_nodes: list[str], pool: str
) -> None:
    # The pool's nodes narrowed to node 0, whose one device has 128 MiB: the planner counts the pool's
    # 80 GB GPUs, the claim's memory floor (the plan's peak) lets the scheduler allocate nothing there.
    custom = client.CustomObjectsApi(kube.api_client)
    custom.patch_cluster_custom_object(GROUP, VERSION, "gpunodepools", pool, {"spec": {"nodeSelector": {
        "memfit.dev/pool": NODE_POOL, "kubernetes.io/hostname": dra_nodes[0]}}})
    doc = quickstart("too-small", placement={"maxNodes": 1, "nodePools": [pool]},
                     recovery={"maxReplans": 0, "capacityTimeoutSeconds": 15})
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, "too-small", ("Failed", "Succeeded"), TIMEOUT, operator)
    attempts = job["status"]["attempts"]
    assert attempts[0]["outcome"] == "NoCapacity", attempts
    assert "cannot allocate all claims" in attempts[0]["reason"], attempts[0]["reason"]

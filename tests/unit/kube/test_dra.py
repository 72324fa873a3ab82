"""GPUs by claim (a DRA pool): the ResourceClaimTemplates memfit writes, the pods that use them, the
pool's capacity from ResourceSlices and allocated claims, and a pool whose DeviceClass is missing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from factories import OWNER, PLACEMENT, POD, make_plan, make_spec
from memfit.api.pool import GPUNodePool
from memfit.kube.common import DeviceRequest
from memfit.kube.profile_job import build_profile_job, profile_claim_template
from memfit.kube.train_job import build_training_job, training_claim_template
from memfit.lifecycle.capacity import observe_pools
from memfit.lifecycle.dra_capacity import DraInventory
from memfit.lifecycle.profiling import placement_of
from memfit.lifecycle.world import World
from pydantic import ValidationError

GPUS = DeviceRequest(device_class="gpu.nvidia.com", driver="gpu.nvidia.com")
SLICES = DeviceRequest(device_class="mig.nvidia.com", driver="gpu.nvidia.com", mig_profile="1g.10gb")
GIB = 1024**3


def dra_pool(name: str = "h100-dra", device_class: str = "gpu.nvidia.com", mig: str | None = None) -> GPUNodePool:
    gpu: dict[str, Any] = {"product": "NVIDIA-H100-80GB-HBM3", "perNode": 2, "dra": {"deviceClassName": device_class}}
    if mig:
        gpu["mig"] = {"profile": mig}
    return GPUNodePool.model_validate({"metadata": {"name": name},
                                       "spec": {"gpu": gpu, "nodeSelector": {"pool": "h100"}, "maxNodes": 2}})


def test_a_dra_pool_places_its_pods_by_claim() -> None:
    placement = placement_of(dra_pool())
    assert placement.dra == GPUS
    assert placement_of(dra_pool(device_class="mig.nvidia.com", mig="1g.10gb")).dra == SLICES
    assert placement_of(GPUNodePool.model_validate(
        {"metadata": {"name": "plain"}, "spec": {"gpu": {"product": "NVIDIA-L4"}}})).dra is None


def test_the_training_template_asks_for_the_plans_gpus_each_with_its_peak_plus_headroom() -> None:
    plan = make_plan(gpus_per_node=4, headroom_percent=10)
    plan = plan.model_copy(update={"memory": plan.memory.model_copy(update={"peak_bytes": 20 * GIB})})
    placement = replace(PLACEMENT, dra=GPUS)
    template = training_claim_template(owner=OWNER, plan=plan, placement=placement)
    assert template is not None
    assert (template["apiVersion"], template["kind"]) == ("resource.k8s.io/v1", "ResourceClaimTemplate")
    assert template["metadata"]["name"] == "llama-train-1-gpus"
    assert template["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["name"] == "gpus"
    exactly = request["exactly"]
    assert (exactly["deviceClassName"], exactly["allocationMode"], exactly["count"]) == ("gpu.nvidia.com", "ExactCount", 4)
    assert exactly["selectors"] == [{"cel": {"expression":
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("22528Mi")) >= 0'}}]  # 20 GiB x 1.1
    assert training_claim_template(owner=OWNER, plan=plan, placement=PLACEMENT) is None  # device plugin


def test_a_mig_pool_by_claim_also_requires_the_profile() -> None:
    template = profile_claim_template(owner=OWNER, placement=replace(PLACEMENT, dra=SLICES))
    assert template is not None and template["metadata"]["name"] == "llama-profile-gpus"
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["count"] == 1
    assert exactly["selectors"] == [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'}}]


def test_the_pods_use_the_claim_instead_of_an_extended_resource() -> None:
    placement = replace(PLACEMENT, dra=GPUS)
    for job in (build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=placement, pod=POD),
                build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=placement, pod=POD,
                                  timeout_seconds=300)):
        pod = job["spec"]["template"]["spec"]
        name = job["metadata"]["name"]
        assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": f"{name}-gpus"}]
        resources = pod["containers"][0]["resources"]
        assert resources["claims"] == [{"name": "gpus"}]
        assert not any(k.startswith("nvidia.com/") for k in resources.get("limits", {})), resources


def _device(name: str, kind: str = "gpu", profile: str | None = None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": kind}}
    if profile:
        attributes["profile"] = {"string": profile}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}


def _slice(node: str, devices: list[dict[str, Any]], driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"spec": {"driver": driver, "nodeName": node, "pool": {"name": node}, "devices": devices}}


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": "h100"}}, "spec": {},
            "status": {"allocatable": {}, "conditions": [{"type": "Ready", "status": "True"}]}}


def _claim(node: str, device: str, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": driver, "pool": node, "device": device}]}}}}


def test_a_dra_pools_capacity_is_its_drivers_devices_less_the_allocated_ones() -> None:
    inventory = DraInventory(
        slices=[_slice("n0", [_device("gpu-0"), _device("gpu-1"), _device("mig-0", "mig", "1g.10gb")]),
                _slice("n1", [_device("gpu-0"), _device("gpu-1")]),
                _slice("n1", [_device("other-0")], driver="other.example.com")],
        claims=[_claim("n0", "gpu-0"), _claim("n1", "other-0", driver="other.example.com")],
        device_classes=frozenset({"gpu.nvidia.com"}))
    whole, mig = dra_pool(), dra_pool("h100-mig", "mig.nvidia.com", "1g.10gb")
    capacity = observe_pools([whole, mig], nodes=[_node("n0"), _node("n1")], pods=[], dra=inventory)
    assert (capacity["h100-dra"].allocatable_gpus, capacity["h100-dra"].free_gpus) == (4, 3)
    assert (capacity["h100-dra"].free_whole_nodes, capacity["h100-dra"].free_gpus_on_shared_nodes) == (1, (1,))
    assert capacity["h100-mig"].allocatable_gpus == 1
    # Without the inventory (the cluster does not serve resource.k8s.io/v1) a DRA pool's capacity is unknown.
    assert "h100-dra" not in observe_pools([whole], nodes=[_node("n0")], pods=[])


def test_a_pool_whose_device_class_is_missing_is_unusable_naming_the_field() -> None:
    world = World(pools=(dra_pool(), dra_pool("typo", "gpu.nvidia.con")), device_classes=frozenset({"gpu.nvidia.com"}))
    assert list(world.unusable_pools()) == ["typo"]
    assert "gpu.dra.deviceClassName 'gpu.nvidia.con' is not a DeviceClass" in world.unusable_pools()["typo"]
    assert World(pools=(dra_pool("typo", "gpu.nvidia.con"),)).unusable_pools() == {}  # classes not read


@pytest.mark.parametrize("name", ["", "Upper.Case", "-leading.dash", "a" * 254])
def test_a_malformed_device_class_name_is_refused_by_the_schema(name: str) -> None:
    with pytest.raises(ValidationError, match="deviceClassName"):
        dra_pool(device_class=name)

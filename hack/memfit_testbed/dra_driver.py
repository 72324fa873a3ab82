"""A stand-in for NVIDIA's DRA driver on KWOK nodes: the DeviceClasses it installs and the ResourceSlices it
publishes, with its attribute and capacity names (`type` gpu|mig, `productName`, `uuid`, `index`,
`profile` and `parentIndex` for a MIG device, `memory`), so the real kube-scheduler allocates memfit's
ResourceClaims against them. Nothing runs on the nodes (there is no kubelet plugin): the pod runner
starts the pods the scheduler bound, as for every KWOK pod."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client

GROUP, VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
GPU_CLASS, MIG_CLASS = "gpu.nvidia.com", "mig.nvidia.com"
Manifest = dict[str, Any]


@dataclass(frozen=True)
class Device:
    """One device of a node: a whole GPU (`profile` None) or a MIG slice of GPU `index`."""

    name: str
    memory_mib: int
    index: int = 0
    product: str = "NVIDIA H100 80GB HBM3"
    profile: str | None = None

    def manifest(self) -> Manifest:
        attributes: Manifest = {"type": {"string": "mig" if self.profile else "gpu"},
                                "productName": {"string": self.product},
                                "uuid": {"string": f"GPU-{self.name}"}}
        if self.profile:
            attributes |= {"profile": {"string": self.profile}, "parentIndex": {"int": self.index}}
        else:
            attributes["index"] = {"int": self.index}
        return {"name": self.name, "attributes": attributes, "capacity": {"memory": {"value": f"{self.memory_mib}Mi"}}}


def device_classes() -> list[Manifest]:
    """gpu.nvidia.com (whole GPUs) and mig.nvidia.com (MIG devices), selected as the driver's chart does."""
    def one(name: str, kind: str) -> Manifest:
        expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"'
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    return [one(GPU_CLASS, "gpu"), one(MIG_CLASS, "mig")]


def node_slice(node: str, devices: list[Device]) -> Manifest:
    """The node's one ResourceSlice (its own pool, generation 1)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [d.manifest() for d in devices]}}


def install(api_client: client.ApiClient, slices: dict[str, list[Device]]) -> None:
    """The DeviceClasses (kept if present) and one ResourceSlice per node."""
    custom = client.CustomObjectsApi(api_client)
    for manifest in device_classes():
        _create(custom, "deviceclasses", manifest)
    for node, devices in slices.items():
        _create(custom, "resourceslices", node_slice(node, devices))


def uninstall(api_client: client.ApiClient, nodes: list[str]) -> None:
    """The nodes' ResourceSlices (the DeviceClasses stay: other modules may use them)."""
    custom = client.CustomObjectsApi(api_client)
    for node in nodes:
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", f"{node}-{DRIVER}")
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise


def _create(custom: client.CustomObjectsApi, plural: str, manifest: Manifest) -> None:
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, plural, manifest)
    except client.exceptions.ApiException as error:
        if error.status != 409:
            raise

"""Dynamic Resource Allocation (resource.k8s.io/v1) for a pool whose GPUs are requested by claim
(GPUNodePool `gpu.dra`): a ResourceClaimTemplate per training attempt (and one for the profiling Job), from
which Kubernetes makes one ResourceClaim per pod; the pod's trainer container uses that claim instead of
`nvidia.com/gpu`.

The template asks for exactly the plan's GPUs per pod from the pool's DeviceClass, and its CEL selector
requires what the plan needs of each device: at least the predicted peak plus the job's headroom of device
memory (`device.capacity[<driver>].memory`, the capacity NVIDIA's DRA driver publishes for every GPU and
MIG device) and, for a MIG pool, the profile (`device.attributes[<driver>].profile`). So the scheduler
never places a pod on a device that cannot hold it, whatever else the DeviceClass admits. The template
belongs to the MemoryOptimizedTrainingJob (deleted with it); each claim belongs to its pod and goes with
it, which frees the devices.
"""

from __future__ import annotations

import math

from memfit.kube.common import DeviceRequest, Manifest, Owner, metadata

API_VERSION = "resource.k8s.io/v1"
CLAIM = "gpus"  # the claim's name in the pod, and its one request's
MIB = 1024**2


def claim_template_name(workload: str) -> str:
    """The template of a profiling or training Job: `<job>-gpus`."""
    return f"{workload}-gpus"


def device_selectors(request: DeviceRequest, min_bytes: int | None) -> list[Manifest]:
    """The CEL selectors every device of the claim must pass (beyond its DeviceClass's)."""
    driver = request.driver
    expressions = []
    if request.mig_profile:
        expressions.append(f'device.attributes["{driver}"].profile == "{request.mig_profile}"')
    if min_bytes:
        mib = math.ceil(min_bytes / MIB)
        expressions.append(f'device.capacity["{driver}"].memory.compareTo(quantity("{mib}Mi")) >= 0')
    return [{"cel": {"expression": e}} for e in expressions]


def build_claim_template(*, owner: Owner, name: str, request: DeviceRequest, count: int,
                         min_bytes: int | None, labels: dict[str, str]) -> Manifest:
    """ResourceClaimTemplate `name`: `count` devices of the pool's class, each with `min_bytes` of memory."""
    exactly: Manifest = {"deviceClassName": request.device_class, "allocationMode": "ExactCount", "count": count}
    if selectors := device_selectors(request, min_bytes):
        exactly["selectors"] = selectors
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata(name=name, owner=owner, labels=labels),
        "spec": {"metadata": {"labels": labels},
                 "spec": {"devices": {"requests": [{"name": CLAIM, "exactly": exactly}]}}},
    }


def use_claim(pod_spec: Manifest, container: Manifest, template: str) -> None:
    """The pod gets a claim from `template` and `container` uses it (in place of an extended resource)."""
    pod_spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": template}]
    container.setdefault("resources", {})["claims"] = [{"name": CLAIM}]

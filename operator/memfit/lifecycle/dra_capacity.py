"""Live capacity of a DRA pool (GPUNodePool `gpu.dra`): its devices are the ones its driver publishes in
ResourceSlices for the pool's nodes (whole GPUs, `type: gpu`, or the pool's MIG profile, `type: mig` with
`profile`, as NVIDIA's DRA driver publishes them), and a device is in use while an allocated
ResourceClaim holds it. memfit does not evaluate a DeviceClass's own CEL selectors here: a class that
admits only part of the driver's GPUs is over-counted, which capacity tolerates (an over-booked pool ends
in the capacity timeout and a re-plan, as with the device plugin)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DraInventory:
    """What DRA capacity is read from: every ResourceSlice, the allocated ResourceClaims, the DeviceClasses."""

    slices: Sequence[Manifest] = ()
    claims: Sequence[Manifest] = ()
    device_classes: frozenset[str] = field(default_factory=frozenset)


def _attribute(device: Manifest, name: str) -> object:
    value = (device.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if isinstance(value, dict) else None


def _matches(device: Manifest, mig_profile: str | None) -> bool:
    kind = _attribute(device, "type")
    if mig_profile is not None:
        return kind == "mig" and _attribute(device, "profile") == mig_profile
    return kind in (None, "gpu")


def devices_by_node(inventory: DraInventory, *, driver: str, mig_profile: str | None) -> dict[str, set[tuple[str, str]]]:
    """The pool's devices on each node, as (ResourceSlice pool, device name)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for piece in inventory.slices:
        spec = piece.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") != driver or not node:
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or []:
            if _matches(device, mig_profile):
                out.setdefault(str(node), set()).add((pool, str(device.get("name"))))
    return out


def allocated(inventory: DraInventory, *, driver: str) -> set[tuple[str, str]]:
    """(ResourceSlice pool, device) of every device an allocated claim holds from `driver`."""
    out: set[tuple[str, str]] = set()
    for claim in inventory.claims:
        results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])
        out.update((str(r.get("pool")), str(r.get("device"))) for r in results if r.get("driver") == driver)
    return out

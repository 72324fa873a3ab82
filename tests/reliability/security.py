"""Security properties (issue 8 §6): what any pod memfit builds may and may not contain, and where
secrets must never appear.

`pod_violations` checks one Job or Pod manifest; `valid_specs` generates specs a user may submit (all
accepted by the API), for a property test over the builders; `find_secrets` scans text for canaries.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hostile_specs import QUICKSTART
from hypothesis import strategies as st

ALLOWED_VOLUMES = {"configMap", "emptyDir", "persistentVolumeClaim"}
HOST_FIELDS = ("hostNetwork", "hostPID", "hostIPC", "hostUsers")


def pod_spec_of(manifest: dict[str, Any]) -> dict[str, Any]:
    if manifest.get("kind") == "Job" or "template" in (manifest.get("spec") or {}):
        return dict(manifest["spec"]["template"]["spec"])
    return dict(manifest["spec"])


def pod_violations(manifest: dict[str, Any], *, namespace: str) -> list[str]:
    """Everything in a memfit Job or Pod that `restricted` Pod Security or memfit's promises forbid."""
    out: list[str] = []
    meta = manifest.get("metadata") or {}
    where = f"{manifest.get('kind', 'Pod')} {meta.get('name')}"
    if meta.get("namespace") != namespace:
        out.append(f"{where}: namespace {meta.get('namespace')!r}, not the job's {namespace!r}")
    spec = pod_spec_of(manifest)
    for key in HOST_FIELDS:
        if key == "hostUsers":
            if spec.get(key) is True:
                out.append(f"{where}: hostUsers true")
        elif spec.get(key):
            out.append(f"{where}: {key}")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"{where}: volume {volume.get('name')} of type {sorted(kinds)}")
    pod_ctx = spec.get("securityContext") or {}
    if pod_ctx.get("runAsNonRoot") is not True:
        out.append(f"{where}: pod runAsNonRoot is not true")
    if pod_ctx.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser 0")
    if (pod_ctx.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        out.append(f"{where}: seccompProfile not RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not False:
        out.append(f"{where}: service account token mounted")
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        ctx = container.get("securityContext") or {}
        name = f"{where} container {container.get('name')}"
        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        caps = ctx.get("capabilities") or {}
        if caps.get("add"):
            out.append(f"{name}: adds capabilities {caps['add']}")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: does not drop ALL capabilities")
        if ctx.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{name}: hostPort {port['hostPort']}")
    return out


label_values = st.from_regex(r"\A[a-z0-9]([-a-z0-9_.]{0,20}[a-z0-9])?\Z")
subdomains = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]{1,8})?\Z")
STRATEGIES = [
    {},
    {"engine": "ddp", "zeroStage": 0, "offload": "none"},
    {"engine": "fsdp", "zeroStage": 3},
    {"engine": "deepspeed", "zeroStage": 3, "offload": "nvme"},
    {"engine": "deepspeed", "zeroStage": 2, "offload": "cpu", "optimizer8bit": "disabled"},
    {"precision": "fp32", "activationCheckpointing": "full"},
]


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A MOTJ spec the API server accepts, varying everything that reaches a pod."""
    spec = copy.deepcopy(QUICKSTART["spec"])
    spec["placement"] = {"maxNodes": draw(st.integers(1, 4))}
    spec["strategy"] = dict(draw(st.sampled_from(STRATEGIES)))
    spec["image"] = draw(
        st.sampled_from(["", "trainer:1", "registry.local:5000/ml/trainer@sha256:" + "a" * 64])
    )
    spec["scheduling"] = {
        "kueueQueue": draw(st.one_of(st.just(""), label_values)),
        "podGroup": draw(st.booleans()),
        "priorityClassName": draw(st.one_of(st.just(""), subdomains)),
    }
    claim = draw(st.one_of(st.none(), subdomains))
    spec["training"] = {**spec["training"], "checkpoint": {"volumeClaim": claim} if claim else {}}
    return spec


def find_secrets(text: str, secrets: list[str]) -> list[str]:
    """The secrets (canaries, credentials) that occur in `text`."""
    return [s for s in secrets if s and s in text]


def dump(objects: list[Any]) -> str:
    return json.dumps(objects, default=str)

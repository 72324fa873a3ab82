"""Merge a job's `spec.podTemplate` into a pod template memfit built (profiling or training).

What memfit built stays as it was; the template only adds: labels and annotations, env and envFrom on every
container, its volumes, its mounts on memfit's containers, a service account, pull secrets, tolerations,
node-selector terms, sidecars (native: init containers with restartPolicy Always, started first) and init
containers (after the sidecars, before memfit's own download step). The admission rules
(`memfit.api.pod_template_rules`) already refused a template that names anything memfit owns; the merge
still lets memfit's value win wherever both set one (the node selector of the pool, a label).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from memfit.api.common import ApiModel
from memfit.api.pod_template import Container, PodTemplate
from memfit.kube.common import Manifest, container_security_context


def _wire(items: Sequence[ApiModel]) -> list[Manifest]:
    return [item.to_wire() for item in items]


def _user_container(container: Container, template: PodTemplate, *, sidecar: bool) -> Manifest:
    out: dict[str, Any] = container.to_wire()
    # The template's variables first, the container's own after them (a later entry of one name wins).
    env = _wire(template.env) + list(out.pop("env", []))
    env_from = _wire(template.env_from) + list(out.pop("envFrom", []))
    if env:
        out["env"] = env
    if env_from:
        out["envFrom"] = env_from
    out["securityContext"] = container_security_context()
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def apply_pod_template(pod_template: Manifest, template: PodTemplate | None) -> Manifest:
    """`pod_template` (a Job's `spec.template`) with the job's podTemplate added; a copy, or the same
    manifest when the job has none."""
    if template is None:
        return pod_template
    out = copy.deepcopy(pod_template)
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**template.labels, **meta.get("labels", {})}
    if template.annotations or meta.get("annotations"):
        meta["annotations"] = {**template.annotations, **meta.get("annotations", {})}
    spec = out["spec"]
    for container in (*spec.get("initContainers", []), *spec["containers"]):
        container["env"] = container.get("env", []) + _wire(template.env)
        if template.env_from:
            container["envFrom"] = container.get("envFrom", []) + _wire(template.env_from)
        container["volumeMounts"] = container.get("volumeMounts", []) + _wire(template.volume_mounts)
    spec["volumes"] = spec.get("volumes", []) + _wire(template.volumes)
    if template.service_account_name:
        spec["serviceAccountName"] = template.service_account_name
        # The ServiceAccount's own automount setting applies (a platform's SA is there for its token).
        spec.pop("automountServiceAccountToken", None)
    if template.image_pull_secrets:
        spec["imagePullSecrets"] = _wire(template.image_pull_secrets)
    tolerations = spec.get("tolerations", [])
    spec["tolerations"] = tolerations + [t for t in _wire(template.tolerations) if t not in tolerations]
    spec["nodeSelector"] = {**template.node_selector, **spec.get("nodeSelector", {})}
    added = [_user_container(c, template, sidecar=True) for c in template.sidecars]
    added += [_user_container(c, template, sidecar=False) for c in template.init_containers]
    if added:
        spec["initContainers"] = added + spec.get("initContainers", [])
    return out


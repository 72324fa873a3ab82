"""What `spec.podTemplate` may not touch, over the wire-form spec: each violation with its field path and what
is allowed (run by `memfit.api.rules.check_spec`). The messages and the CEL rules of the CRD
(`CEL_RULES`, merged by `memfit.api.crdgen`) are written here side by side, so admission and the operator
refuse a template in the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.api import pod as contract
from memfit.api.pod_template import VOLUME_SOURCES

Findings = list[tuple[str, str]]
BASE = "spec.podTemplate"


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


OWNED_METADATA = (
    "keys memfit, Kueue and the Job controller write are refused: prefixes "
    + ", ".join(contract.OWNED_METADATA_PREFIXES) + " and " + ", ".join(contract.OWNED_METADATA_KEYS))
OWNED_ENV = "memfit sets this variable itself (its own: " + ", ".join(contract.OWNED_ENV) + ")"
OWNED_VOLUME = ("memfit names its own volumes " + ", ".join(contract.OWNED_VOLUMES)
                + f" and {contract.OWNED_VOLUME_PREFIX}<n>: choose another name")
ONE_SOURCE = "a volume needs exactly one source: one of " + ", ".join(VOLUME_SOURCES)
OWNED_MOUNT = ("mountPath must be absolute and not at or inside a path memfit mounts ("
               + ", ".join(contract.OWNED_MOUNTS) + ")")
UNKNOWN_VOLUME = "a volumeMount must name a volume of spec.podTemplate.volumes"
OWNED_CONTAINER = ("container names must be unique and not memfit's own ("
                   + ", ".join(contract.OWNED_CONTAINERS) + ")")
OWNED_RESOURCE = (f"{contract.OWNED_RESOURCE_PREFIX}* resources are memfit's to request (the plan's GPUs): "
                  "a sidecar or init container may ask for cpu, memory and ephemeral-storage")
SECURITY_CONTEXT = ("memfit sets the restricted security context itself (non-root uid 1000, no privilege "
                    "escalation, all capabilities dropped, seccomp RuntimeDefault): remove securityContext")
RESTART_POLICY = "restartPolicy is memfit's: list a container that runs for the pod's life under sidecars"

_PREFIXES = _cel_list(contract.OWNED_METADATA_PREFIXES)
_KEYS = _cel_list(contract.OWNED_METADATA_KEYS)
_MOUNTS = _cel_list(contract.OWNED_MOUNTS)
_METADATA_RULE = {"rule": f"self.all(k, !{_PREFIXES}.exists(p, k.startsWith(p)) && !(k in {_KEYS}))",
                  "message": OWNED_METADATA}
_MOUNT_RULE = {"rule": f"self.mountPath.startsWith('/') && !{_MOUNTS}.exists(p, self.mountPath == p || "
                       "self.mountPath.startsWith(p + '/'))", "message": OWNED_MOUNT, "fieldPath": ".mountPath"}
_RESOURCE_RULE = {
    "rule": f"(!has(self.limits) || !self.limits.exists(k, k.startsWith('{contract.OWNED_RESOURCE_PREFIX}'))) && "
            f"(!has(self.requests) || !self.requests.exists(k, k.startsWith('{contract.OWNED_RESOURCE_PREFIX}')))",
    "message": OWNED_RESOURCE}
_CONTAINERS_RULE = {
    "rule": f"self.all(c, !(c.name in {_cel_list(contract.OWNED_CONTAINERS)}) && self.exists_one(d, d.name == c.name))",
    "message": OWNED_CONTAINER}


def _mounts_name_volumes(where: str) -> str:
    return f"self.{where}.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name))"


_T = "MemoryOptimizedTrainingJob.spec.podTemplate"
CEL_RULES: dict[str, list[dict[str, str]]] = {
    _T: [
        {"rule": f"!has(self.volumeMounts) || {_mounts_name_volumes('volumeMounts')}",
         "message": UNKNOWN_VOLUME, "fieldPath": ".volumeMounts"},
        *({"rule": f"!has(self.{kind}) || self.{kind}.all(c, !has(c.volumeMounts) || "
                   "c.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
           "message": UNKNOWN_VOLUME, "fieldPath": f".{kind}"} for kind in ("sidecars", "initContainers")),
        {"rule": "!has(self.sidecars) || !has(self.initContainers) || "
                 "self.sidecars.all(s, !self.initContainers.exists(i, i.name == s.name))",
         "message": OWNED_CONTAINER, "fieldPath": ".initContainers"},
    ],
    f"{_T}.labels": [_METADATA_RULE],
    f"{_T}.annotations": [_METADATA_RULE],
    f"{_T}.env": [{"rule": f"self.all(e, !(e.name in {_cel_list(contract.OWNED_ENV)}))", "message": OWNED_ENV}],
    f"{_T}.volumes": [
        {"rule": f"self.all(v, !(v.name in {_cel_list(contract.OWNED_VOLUMES)}) && "
                 f"!v.name.startsWith('{contract.OWNED_VOLUME_PREFIX}') && self.exists_one(w, w.name == v.name))",
         "message": OWNED_VOLUME},
    ],
    f"{_T}.volumes[]": [
        {"rule": " + ".join(f"(has(self.{s}) ? 1 : 0)" for s in VOLUME_SOURCES) + " == 1", "message": ONE_SOURCE},
    ],
    f"{_T}.volumeMounts[]": [_MOUNT_RULE],
    f"{_T}.sidecars": [_CONTAINERS_RULE],
    f"{_T}.initContainers": [_CONTAINERS_RULE],
    **{f"{_T}.{kind}[]": [
        {"rule": "!has(self.securityContext)", "message": SECURITY_CONTEXT, "fieldPath": ".securityContext"},
        {"rule": "!has(self.restartPolicy)", "message": RESTART_POLICY, "fieldPath": ".restartPolicy"},
    ] for kind in ("sidecars", "initContainers")},
    f"{_T}.sidecars[].resources": [_RESOURCE_RULE],
    f"{_T}.initContainers[].resources": [_RESOURCE_RULE],
}


def _owned_key(key: str) -> bool:
    return key.startswith(contract.OWNED_METADATA_PREFIXES) or key in contract.OWNED_METADATA_KEYS


def _owned_mount(path: Any) -> bool:
    return isinstance(path, str) and (not path.startswith("/") or any(
        path == p or path.startswith(p + "/") for p in contract.OWNED_MOUNTS))


def _items(doc: Mapping[str, Any], key: str) -> list[tuple[int, Mapping[str, Any]]]:
    value = doc.get(key)
    return [(i, item) for i, item in enumerate(value) if isinstance(item, Mapping)] if isinstance(value, list) else []


def _metadata(template: Mapping[str, Any]) -> Findings:
    found: Findings = []
    for field in ("labels", "annotations"):
        keys = template.get(field)
        if isinstance(keys, Mapping):
            found += [(f"{BASE}.{field}[{key}]", OWNED_METADATA) for key in keys if _owned_key(str(key))]
    return found


def _env(template: Mapping[str, Any]) -> Findings:
    return [(f"{BASE}.env[{i}].name", f"{OWNED_ENV}; got {e.get('name')}")
            for i, e in _items(template, "env") if e.get("name") in contract.OWNED_ENV]


def _volumes(template: Mapping[str, Any]) -> Findings:
    found: Findings = []
    seen: set[Any] = set()
    for i, volume in _items(template, "volumes"):
        name = volume.get("name")
        if name in contract.OWNED_VOLUMES or (isinstance(name, str) and name.startswith(contract.OWNED_VOLUME_PREFIX)) \
                or name in seen:
            found.append((f"{BASE}.volumes[{i}].name", f"{OWNED_VOLUME} (names are unique); got {name}"))
        seen.add(name)
        sources = [s for s in VOLUME_SOURCES if volume.get(s) is not None]
        if len(sources) != 1:
            found.append((f"{BASE}.volumes[{i}]", f"{ONE_SOURCE}; got {', '.join(sources) or 'none'}"))
    return found


def _mounts(template: Mapping[str, Any], holder: Mapping[str, Any], where: str, *, check_paths: bool) -> Findings:
    names = {v.get("name") for _, v in _items(template, "volumes")}
    found: Findings = []
    for i, mount in _items(holder, "volumeMounts"):
        if mount.get("name") not in names:
            found.append((f"{where}.volumeMounts[{i}].name", f"{UNKNOWN_VOLUME}; got {mount.get('name')}"))
        if check_paths and _owned_mount(mount.get("mountPath")):
            found.append((f"{where}.volumeMounts[{i}].mountPath", f"{OWNED_MOUNT}; got {mount.get('mountPath')}"))
    return found


def _containers(template: Mapping[str, Any]) -> Findings:
    found: Findings = []
    seen: set[Any] = set()
    for kind in ("sidecars", "initContainers"):
        for i, container in _items(template, kind):
            where = f"{BASE}.{kind}[{i}]"
            name = container.get("name")
            if name in contract.OWNED_CONTAINERS or name in seen:
                found.append((f"{where}.name", f"{OWNED_CONTAINER}; got {name}"))
            seen.add(name)
            if container.get("securityContext") is not None:
                found.append((f"{where}.securityContext", SECURITY_CONTEXT))
            if container.get("restartPolicy") is not None:
                found.append((f"{where}.restartPolicy", RESTART_POLICY))
            resources = container.get("resources")
            for part in ("limits", "requests"):
                asked = resources.get(part) if isinstance(resources, Mapping) else None
                if isinstance(asked, Mapping):
                    found += [(f"{where}.resources.{part}[{key}]", OWNED_RESOURCE) for key in asked
                              if str(key).startswith(contract.OWNED_RESOURCE_PREFIX)]
            found += _mounts(template, container, where, check_paths=False)
    return found


def check_pod_template(spec: Mapping[str, Any]) -> Findings:
    """Every way `spec.podTemplate` would change what memfit owns, naming the field."""
    template = spec.get("podTemplate")
    if not isinstance(template, Mapping):
        return []
    return (_metadata(template) + _env(template) + _volumes(template)
            + _mounts(template, template, BASE, check_paths=True) + _containers(template))

"""Pod spec → local process inputs for the local pod runner (memfit_testbed.pod_runner): env, downward API, volumes, rewrites."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from memfit_trainer.probe.expansion import expand as _kubernetes_expand

LOCAL_IP = "127.0.0.1"
DEFAULT_MASTER_PORT = "29500"

Obj = dict[str, Any]


class ConfigError(Exception):
    """The pod cannot start (missing ConfigMap, Secret, command...): CreateContainerConfigError."""


# --- $(VAR) expansion and quantities --------------------------------------------------------------

# Kubernetes' $(VAR) expansion (known names replaced, `$$` escapes, unknown ones stay): the probe's, which does
# the kubelet's part per run in memfit's profiling pod.
expand = _kubernetes_expand


_SUFFIX = {"": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "P": 1e15, "E": 1e18, **{s + "i": 2.0 ** (10 * (i + 1)) for i, s in enumerate("KMGTPE")}}


def quantity(q: str | int | float) -> float:
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([A-Za-z]{0,2})", str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ConfigError(f"bad quantity {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def _node_capacity(resource: str) -> float:
    if resource.endswith("cpu"):
        return float(os.cpu_count() or 1)
    if resource.endswith("memory"):
        with open("/proc/meminfo") as f:
            return float(f.readline().split()[1]) * 1024
    return 0.0


# --- downward API --------------------------------------------------------------------------------

_META_KEY = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def field_value(pod: Obj, path: str) -> str:
    """A downward-API fieldRef value; pod and host IPs are the loopback address."""
    meta = pod["metadata"]
    if m := _META_KEY.fullmatch(path):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "".join(f"{k}={json.dumps(v)}\n" for k, v in items)
    simple = {
        "metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": LOCAL_IP, "status.podIPs": LOCAL_IP, "status.hostIP": LOCAL_IP,
        "status.hostIPs": LOCAL_IP,
    }
    if path not in simple:
        raise ConfigError(f"unsupported fieldRef {path!r}")
    return str(simple[path])


def resource_value(pod: Obj, container_name: str, ref: Obj) -> str:
    """A resourceFieldRef value (ceil(quantity / divisor)); unset limits are the host's capacity."""
    name = ref.get("containerName") or container_name
    cont = next((c for c in pod["spec"]["containers"] if c["name"] == name), None)
    if cont is None:
        raise ConfigError(f"resourceFieldRef names unknown container {name!r}")
    kind, _, resource = ref["resource"].partition(".")
    res = cont.get("resources") or {}
    value = (res.get(kind) or {}).get(resource)
    if value is None and kind == "requests":
        value = (res.get("limits") or {}).get(resource)
    amount = quantity(value) if value is not None else (_node_capacity(resource) if kind == "limits" else 0.0)
    divisor = quantity(ref.get("divisor") or "1") or 1.0  # the API defaults an unset divisor to "0"
    return str(math.ceil(amount / divisor - 1e-9))


# --- host names and ports ------------------------------------------------------------------------


class PortMap:
    """One free local port per (namespace, pod DNS name, port) so parallel jobs never share one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, str, str], int] = {}

    def get(self, namespace: str, host: str, port: str) -> int:
        key = (namespace, host, str(port))
        with self._lock:
            if key not in self._ports:
                used = set(self._ports.values())
                while True:
                    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                        s.bind((LOCAL_IP, 0))
                        p = int(s.getsockname()[1])
                    if p not in used:
                        break
                self._ports[key] = p
            return self._ports[key]


def mount_parents(paths: dict[str, str], root: Path) -> dict[str, str]:
    """Folders above the mount paths (`/memfit/volumes` above `/memfit/volumes/models`), as a container's
    filesystem has them: each becomes a folder under `root` holding a link per mount below it, so a path
    the program builds from the parent (`$MEMFIT_VOLUMES_DIR/<claim>/...`) lands in the mount's folder.
    "/" is never one (every absolute path would be rewritten)."""
    parents: dict[str, str] = {}
    for mount, local in paths.items():
        mount_path = PurePosixPath(mount)
        if not mount_path.is_absolute() or mount.startswith("/dev/"):
            continue
        for parent in mount_path.parents:
            if str(parent) == "/" or str(parent) in paths:
                continue
            parents[str(parent)] = str(root / str(parent).lstrip("/"))
        link = root / mount.strip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink() and not link.exists():
            link.symlink_to(local)
    return parents


_PATH_CHARS = r"[\w.\-/]"


@dataclass
class Rewriter:
    """Rewrites env values and args: mount paths → local folders, pod DNS names → 127.0.0.1 (port mapped).

    A pod DNS name is `<hostname>.<sub>[.<namespace>[.svc[.cluster.local]]]` where <sub> is the pod's own
    spec.subdomain or a headless Service of its namespace. `<name>:<port>` becomes `127.0.0.1:<local port>`;
    an env var `*MASTER_ADDR` naming a pod gets its sibling `*MASTER_PORT` (default 29500) mapped likewise.
    """

    namespace: str
    paths: dict[str, str]
    subdomains: list[str]
    ports: PortMap
    _path_re: re.Pattern[str] | None = field(init=False, default=None)
    _host_re: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.paths = {p.rstrip("/"): v for p, v in self.paths.items() if p.rstrip("/")}
        if self.paths:
            alts = "|".join(re.escape(p) for p in sorted(self.paths, key=len, reverse=True))
            self._path_re = re.compile(rf"(?<!{_PATH_CHARS})({alts})(?=/|$|[^\w.\-])")
        subs = sorted({s for s in self.subdomains if s}, key=len, reverse=True)
        if subs:
            ns = re.escape(self.namespace)
            label = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
            self._host_re = re.compile(
                rf"(?<![\w.-])(?P<host>{label})\.(?P<sub>{'|'.join(map(re.escape, subs))})"
                rf"(?:\.{ns}(?:\.svc(?:\.cluster\.local)?)?)?(?![\w-])(?::(?P<port>[0-9]{{1,5}})(?![0-9]))?"
            )

    def pod_host(self, value: str) -> str | None:
        """The canonical `<hostname>.<sub>` if `value` is exactly a pod DNS name, else None."""
        m = self._host_re.fullmatch(value.strip()) if self._host_re else None
        return f"{m.group('host')}.{m.group('sub')}" if m and not m.group("port") else None

    def text(self, value: str) -> str:
        if self._path_re is not None:
            value = self._path_re.sub(lambda m: self.paths[m.group(1)], value)
        if self._host_re is not None:
            def host(m: re.Match[str]) -> str:
                if m.group("port") is None:
                    return LOCAL_IP
                local = self.ports.get(self.namespace, f"{m.group('host')}.{m.group('sub')}", m.group("port"))
                return f"{LOCAL_IP}:{local}"

            value = self._host_re.sub(host, value)
        return value

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        out = {k: self.text(v) for k, v in env.items()}
        for k, v in env.items():
            if k.endswith("MASTER_ADDR") and (h := self.pod_host(v)):
                port_var = k[: -len("ADDR")] + "PORT"
                port = env.get(port_var, DEFAULT_MASTER_PORT).strip()
                out[port_var] = str(self.ports.get(self.namespace, h, port))
        return out

    def args(self, args: list[str], env: dict[str, str]) -> list[str]:
        """Rewrite argv; torchrun's --master-addr/--master_addr <pod> also maps --master-port (or PET_)."""
        out, host = list(args), None
        for i, a in enumerate(args):
            flag, eq, val = a.partition("=")
            if flag in ("--master_addr", "--master-addr"):
                host = self.pod_host(val if eq else (args[i + 1] if i + 1 < len(args) else ""))
        has_port = False
        for i, a in enumerate(args):
            flag, eq, val = a.partition("=")
            if host and flag in ("--master_port", "--master-port"):
                has_port = True
                if eq:
                    out[i] = f"{flag}={self.ports.get(self.namespace, host, val)}"
                elif i + 1 < len(args):
                    out[i + 1] = str(self.ports.get(self.namespace, host, args[i + 1]))
        out = [self.text(a) if a == b else a for a, b in zip(out, args, strict=True)]
        if host and not has_port and "PET_MASTER_PORT" not in env:
            env["PET_MASTER_PORT"] = str(self.ports.get(self.namespace, host, DEFAULT_MASTER_PORT))
        return out


# --- env and volumes -----------------------------------------------------------------------------

Lookup = Callable[[str, str, str], "dict[str, str] | None"]  # (kind, namespace, name) -> data or None


def _ref_data(lookup: Lookup, kind: str, ns: str, ref: Obj) -> dict[str, str] | None:
    data = lookup(kind, ns, ref["name"])
    if data is None and not ref.get("optional"):
        raise ConfigError(f"{kind} {ns}/{ref['name']} not found")
    return data


def container_env(pod: Obj, cont: Obj, lookup: Lookup) -> dict[str, str]:
    """The container's env: envFrom, then env in order with $(VAR) expansion and valueFrom resolved."""
    ns, env = pod["metadata"]["namespace"], {}
    for src in cont.get("envFrom") or []:
        kind = "configmap" if "configMapRef" in src else "secret"
        data = _ref_data(lookup, kind, ns, src.get("configMapRef") or src.get("secretRef") or {})
        env.update({src.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for e in cont.get("env") or []:
        vf = e.get("valueFrom")
        if vf is None:
            env[e["name"]] = expand(e.get("value", ""), env)
        elif "fieldRef" in vf:
            env[e["name"]] = field_value(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[e["name"]] = resource_value(pod, cont["name"], vf["resourceFieldRef"])
        else:
            kind, ref = ("configmap", vf["configMapKeyRef"]) if "configMapKeyRef" in vf else (
                "secret", vf["secretKeyRef"])
            data = _ref_data(lookup, kind, ns, ref)
            if data is not None and ref["key"] in data:
                env[e["name"]] = data[ref["key"]]
            elif not ref.get("optional"):
                raise ConfigError(f"key {ref['key']!r} not in {kind} {ns}/{ref['name']}")
    return env


def _write(path: Path, content: str | bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode & 0o777)


def _write_keys(d: Path, data: dict[str, str], src: Obj, kind: str, ns: str) -> None:
    mode = int(src.get("defaultMode", 0o644))
    items = src.get("items")
    if not items:
        for k, v in data.items():
            _write(d / k, v, mode)
        return
    for it in items:
        if it["key"] not in data:
            if src.get("optional"):
                continue
            raise ConfigError(f"key {it['key']!r} not in {kind} {ns}/{src.get('name')}")
        _write(d / it["path"], data[it["key"]], int(it.get("mode", mode)))


def materialise_volume(pod: Obj, vol: Obj, d: Path, lookup: Lookup, token: Callable[[Obj], str]) -> None:
    """Fill folder `d` with volume `vol` (configMap, secret, downwardAPI, projected; others stay empty)."""
    d.mkdir(parents=True, exist_ok=True)
    ns = pod["metadata"]["namespace"]
    sources: list[Obj] = (vol.get("projected") or {}).get("sources") or [vol]
    projected_mode = (vol.get("projected") or {}).get("defaultMode")
    for src in sources:
        for kind, key in (("configmap", "configMap"), ("secret", "secret")):
            if ref := src.get(key):
                ref = {**ref, "name": ref.get("secretName") or ref.get("name")}
                if projected_mode is not None:
                    ref.setdefault("defaultMode", projected_mode)
                data = _ref_data(lookup, kind, ns, ref)
                if data is not None:
                    _write_keys(d, data, ref, kind, ns)
        if dapi := src.get("downwardAPI"):
            for it in dapi.get("items") or []:
                if "fieldRef" in it:
                    value = field_value(pod, it["fieldRef"]["fieldPath"])
                else:
                    value = resource_value(pod, pod["spec"]["containers"][0]["name"], it["resourceFieldRef"])
                _write(d / it["path"], value, int(it.get("mode", 0o644)))
        if sat := src.get("serviceAccountToken"):
            _write(d / sat["path"], token(sat), 0o600)

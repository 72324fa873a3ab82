"""Render the chart with the real helm and index the objects for assertions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e_tools import CHART, KUBE_VERSION, run

Obj = dict[str, Any]
VARIANTS = ("defaults", *sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml")
                                if p.name != "defaults-values.yaml"))


def values_file(variant: str) -> Path:
    return CHART / "ci" / f"{variant}-values.yaml"


@dataclass(frozen=True)
class Rendered:
    """The objects of one `helm template`, with lookups by kind and name."""

    objects: tuple[Obj, ...]

    def kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = [o for o in self.kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        return found[0]

    def pod_specs(self) -> Iterable[tuple[str, Obj]]:
        """(object name, pod spec) of every pod the chart creates directly or through a workload."""
        for o in self.objects:
            if o["kind"] == "Pod":
                yield o["metadata"]["name"], o["spec"]
            elif o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
                yield o["metadata"]["name"], o["spec"]["template"]["spec"]


def helm_template(helm: Path, *args: str, release: str = "memfit", namespace: str = "memfit-system",
                  check: bool = True) -> tuple[Rendered, str]:
    """`helm template` (hooks and tests included); returns the parsed objects and stderr."""
    result = run([helm, "template", release, CHART, "--namespace", namespace, "--kube-version", KUBE_VERSION,
                  *args], check=check)
    if result.returncode != 0:
        return Rendered(()), result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return Rendered(tuple(docs)), result.stderr


def render_variant(helm: Path, variant: str) -> Rendered:
    args = [] if variant == "defaults" else ["-f", str(values_file(variant))]
    return helm_template(helm, *args)[0]


def load_values(variant: str) -> Obj:
    base: Obj = yaml.safe_load((CHART / "values.yaml").read_text())
    if variant != "defaults":
        _merge(base, yaml.safe_load(values_file(variant).read_text()) or {})
    return base


def _merge(into: Obj, other: Obj) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value

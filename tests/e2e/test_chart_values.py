"""values.yaml and values.schema.json: strict schema (bad values are refused by helm), every value documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from e2e_chart import VARIANTS, helm_template, load_values
from e2e_tools import CHART

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

BAD_VALUES = {
    "unknown top-level key": (["--set", "replicas=2"], "replicas"),
    "unknown nested key": (["--set", "operator.replicaCount=2"], "replicaCount"),
    "namespace not a DNS label": (["--set", "operator.watchNamespaces[0]=Team_A"], "watchNamespaces"),
    "pull policy not an enum value": (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    "digest not sha256": (["--set", "image.digest=latest"], "digest"),
    "no reconcile workers": (["--set", "operator.workers=0"], "workers"),
    "port below 1024": (["--set", "metrics.port=80"], "port"),
    "pool without spec": (["--set", "gpuNodePools[0].name=l4"], "spec"),
    "pool capacity type": (["--set", "gpuNodePools[0].name=l4", "--set", "gpuNodePools[0].spec.gpu.product=L4",
                            "--set", "gpuNodePools[0].spec.capacityType=cheap"], "capacityType"),
    "crds.enabled not a boolean": (["--set-string", "crds.enabled=yes"], "enabled"),
    "scrape interval not a duration": (["--set", "serviceMonitor.interval=often"], "interval"),
}


@pytest.mark.parametrize("args,needle", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_helm_refuses_bad_values(helm: Path, args: list[str], needle: str) -> None:
    rendered, stderr = helm_template(helm, *args, check=False)
    assert not rendered.objects
    assert "values don't meet the specifications of the schema" in stderr
    assert needle in stderr


def test_schema_is_valid_draft7_and_accepts_every_variant() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    for variant in VARIANTS:
        jsonschema.Draft7Validator(SCHEMA).validate(load_values(variant))


def test_schema_is_strict_at_every_chart_level() -> None:
    """Every object the chart defines (not free-form Kubernetes objects) forbids unknown keys."""
    free_form = {"podSecurityContext", "securityContext", "affinity", "spec", "host", "interconnect", "gpu",
                 "extraEnv[]"}  # Kubernetes objects the API server validates

    def walk(node: dict[str, object], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            name = path.rsplit(".", 1)[-1]
            if name not in free_form:
                assert node.get("additionalProperties") is False, path
        for key, child in (node.get("properties") or {}).items():  # type: ignore[union-attr]
            walk(child, f"{path}.{key}")  # type: ignore[arg-type]
        for key, child in (node.get("definitions") or {}).items():  # type: ignore[union-attr]
            walk(child, f"#{key}")  # type: ignore[arg-type]
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")  # type: ignore[arg-type]

    walk(SCHEMA, "values")


def test_every_value_is_in_the_schema() -> None:
    def walk(values: object, schema: dict[str, object], path: str) -> None:
        if "$ref" in schema:
            schema = SCHEMA["definitions"][str(schema["$ref"]).rsplit("/", 1)[-1]]
        if isinstance(values, dict) and "properties" in schema:
            props = schema["properties"]
            assert isinstance(props, dict)
            for key, value in values.items():
                assert key in props, f"{path}.{key} is not in values.schema.json"
                walk(value, props[key], f"{path}.{key}")

    walk(yaml.safe_load((CHART / "values.yaml").read_text()), SCHEMA, "values")


KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*):(?P<rest>.*)$")


def test_every_value_is_documented() -> None:
    """Every key of values.yaml has a `# --` comment above it or above one of its parent keys."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    documented: list[tuple[int, bool]] = []  # (indent, documented) of the open parents
    undocumented = []
    for i, line in enumerate(lines):
        match = KEY.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"])
        documented = [(ind, doc) for ind, doc in documented if ind < indent]
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        own = j >= 0 and lines[j].strip().startswith("# --")
        is_leaf = match["rest"].strip() != ""
        if is_leaf and not own and not any(doc for _, doc in documented):
            undocumented.append(f"line {i + 1}: {match['key']}")
        documented.append((indent, own))
    assert not undocumented, "values without a `# --` comment: " + ", ".join(undocumented)

"""Generated CRDs: in sync with the models, structural, bounded, and accepting every example."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from memfit.api.crdgen import build_crds
from memfit.cli import main

REPO = Path(__file__).resolve().parents[3]
CRDS = build_crds()
MOTJ = CRDS["memfit.dev_memoryoptimizedtrainingjobs.yaml"]
POOL = CRDS["memfit.dev_gpunodepools.yaml"]


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def test_committed_crds_match_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--check", "--out", str(REPO / "crds")]) == 0


def test_check_detects_drift(tmp_path: Path) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    target = tmp_path / "memfit.dev_gpunodepools.yaml"
    target.write_text(target.read_text().replace("perNode", "perNod"))
    assert main(["crds", "--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("crd", [MOTJ, POOL], ids=["motj", "gpunodepool"])
def test_schema_is_structural_and_bounded(crd: dict[str, Any]) -> None:
    for path, node in _walk(_schema(crd)):
        if node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields"):
            continue
        if path == ".metadata":
            continue
        assert "type" in node, f"{path} has no type"
        assert "$ref" not in node and "anyOf" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "array":
            assert "maxItems" in node, f"{path} list is unbounded"
        plain_string = node["type"] == "string" and "enum" not in node and node.get("format") != "date-time"
        if plain_string and path not in (".apiVersion", ".kind"):
            assert "maxLength" in node, f"{path} string is unbounded"
        if node["type"] == "object" and "properties" not in node:
            assert "maxProperties" in node, f"{path} map is unbounded"
        if path.startswith((".spec.", ".status.")):
            assert node.get("description") or path.endswith(("[]", ".*")) or path.startswith(".status"), (
                f"{path} has no description"
            )


def test_names_columns_and_subresources() -> None:
    names = MOTJ["spec"]["names"]
    assert names["shortNames"] == ["motj"] and names["categories"] == ["memfit"]
    assert POOL["spec"]["names"]["shortNames"] == ["gpupool"]
    assert POOL["spec"]["scope"] == "Cluster"
    version = MOTJ["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == [
        "Phase", "Pool", "GPUs", "Precision", "ZeRO", "Predicted", "$/h", "Savings", "Step", "Loss", "ETA", "Age"
    ]
    wide = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority")}
    assert wide["PEFT"] == ".status.plan.peft"  # kubectl get motj -o wide


def test_cel_rules_cover_cross_field_constraints() -> None:
    spec = _schema(MOTJ)["properties"]["spec"]
    messages = [r["message"] for _, n in _walk(spec) for r in n.get("x-kubernetes-validations", [])]
    assert any("exactly one of builtin, huggingface or entrypoint" in m for m in messages)
    assert any("microBatchSize must divide" in m for m in messages)
    assert any("offload nvme needs engine deepspeed" in m for m in messages)
    assert any("ddp does not shard" in m for m in messages)


def _openapi_to_jsonschema(node: Any) -> Any:
    """x-kubernetes-int-or-string -> integer or string; everything else is JSON-schema compatible."""
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string"):
            return {"type": ["integer", "string"]}
        out = {k: _openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        if "properties" in out:
            out["additionalProperties"] = False
        return out
    return node


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_match_openapi_schema(path: Path) -> None:
    by_kind = {c["spec"]["names"]["kind"]: _openapi_to_jsonschema(_schema(c)) for c in (MOTJ, POOL)}
    for doc in yaml.safe_load_all(path.read_text()):
        schema = by_kind[doc["kind"]]
        schema["properties"]["metadata"] = {"type": "object"}
        jsonschema.Draft4Validator(schema).validate(doc)


def test_openapi_schema_rejects_unknown_field() -> None:
    schema = _openapi_to_jsonschema(_schema(MOTJ))
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["spec"]["strategy"] = {"zeroStagee": 2}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(doc)

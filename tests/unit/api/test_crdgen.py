"""Generated CRDs: in sync with the models, structural, bounded, and accepting every example."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from memfit.api.crdgen import CEL_RULES, build_crds
from memfit.api.finetune_rules import (
    DATA_NEEDS_HF_MODEL,
    ESCAPING_PATH,
    EVAL_EVERY_NEEDS_SET,
    EVAL_PATH_NEEDS_FILES,
    EVAL_SPLIT_NEEDS_HUB,
    REVISION_WITH_VOLUME,
    TOKEN_WITH_VOLUME,
    VOLUME_PATHS,
    inside_volume,
)
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


def _rules(crd: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Schema path (`.spec.data`) -> its CEL rules."""
    return {path: node["x-kubernetes-validations"] for path, node in _walk(_schema(crd))
            if "x-kubernetes-validations" in node}


def test_every_cel_rule_attaches_to_a_schema_node() -> None:
    attached = {f"MemoryOptimizedTrainingJob{path}" for path in _rules(MOTJ)}
    assert set(CEL_RULES) <= attached | {f"GPUNodePool{path}" for path in _rules(POOL)}


# The admission rules docs/finetune.md promises: where each sits, the field the API server names, what it
# refuses with, and the words (the operator's own, from memfit.api.finetune_rules).
ADMISSION_RULES: dict[str, tuple[str, str | None, str | None, str]] = {
    "model path inside the volume": (".spec.problem.huggingface.path", None, None,
                                     inside_volume("spec.problem.huggingface.path")),
    "files path inside the volume": (".spec.data.files.path", None, None, inside_volume("spec.data.files.path")),
    "eval path inside the volume": (".spec.data.evalPath", None, None, inside_volume("spec.data.evalPath")),
    "output path inside the volume": (".spec.output.path", None, None, inside_volume("spec.output.path")),
    "token only for the hub": (".spec.problem.huggingface", ".tokenSecretRef", "FieldValueForbidden",
                               TOKEN_WITH_VOLUME),
    "revision only for the hub": (".spec.problem.huggingface", ".revision", "FieldValueForbidden",
                                  REVISION_WITH_VOLUME),
    "evalSplit only on a hub dataset": (".spec.data", ".evalSplit", "FieldValueForbidden", EVAL_SPLIT_NEEDS_HUB),
    "evalPath only on files": (".spec.data", ".evalPath", "FieldValueForbidden", EVAL_PATH_NEEDS_FILES),
    "evalEverySteps needs an eval set": (".spec.data", ".evalEverySteps", "FieldValueInvalid",
                                         EVAL_EVERY_NEEDS_SET),
    "a dataset needs a hub model": (".spec", ".data", "FieldValueForbidden", DATA_NEEDS_HF_MODEL),
}


@pytest.mark.parametrize(("at", "field_path", "reason", "message"), ADMISSION_RULES.values(),
                         ids=ADMISSION_RULES.keys())
def test_admission_rule_names_the_field(at: str, field_path: str | None, reason: str | None, message: str) -> None:
    rule = next((r for r in _rules(MOTJ).get(at, []) if r["message"] == message), None)
    assert rule is not None, f"no CEL rule at {at} says {message!r}"
    assert rule.get("fieldPath") == field_path and rule.get("reason") == reason
    assert message.startswith((field_path or at).rsplit(".", 1)[-1]), message  # it names the field first


def test_path_rules_use_the_operators_regex() -> None:
    rules = _rules(MOTJ)
    for field_path in VOLUME_PATHS:
        assert rules[f".{field_path}"] == [
            {"rule": f"!self.matches('{ESCAPING_PATH}')", "message": inside_volume(field_path)}]


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

"""Generate the CustomResourceDefinitions from the pydantic models (structural schema, CEL, columns)."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from memfit.api.common import API_GROUP, API_VERSION
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
from memfit.api.job import MemoryOptimizedTrainingJobSpec, MemoryOptimizedTrainingJobStatus
from memfit.api.own_code_rules import CEL_RULES as OWN_CODE_CEL_RULES
from memfit.api.pod_template_rules import CEL_RULES as POD_TEMPLATE_CEL_RULES
from memfit.api.pool import MIG_CEL_RULES, GPUNodePoolSpec, GPUNodePoolStatus

MAX_JOB_NAME = 40  # same bound as memfit.kube.names.MAX_JOB_NAME

Schema = dict[str, Any]

# Bounds for strings/lists that the models leave open (CEL cost estimation needs every one bounded).
DEFAULT_MAX_LENGTH = 1024
DEFAULT_MAX_ITEMS = 64
DEFAULT_MAX_PROPERTIES = 64

# Cross-field rules, keyed by the dotted schema path they attach to. Each mirrors a rule of
# `memfit.api.rules.check_spec` (the fine-tune ones in the same words: `memfit.api.finetune_rules`).
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "MemoryOptimizedTrainingJob.spec": [
        {
            "rule": "!has(self.strategy) || !has(self.strategy.microBatchSize) || "
            "type(self.strategy.microBatchSize) == string || !has(self.training) || "
            "!has(self.training.globalBatchSize) || "
            "self.training.globalBatchSize % int(self.strategy.microBatchSize) == 0",
            "message": "strategy.microBatchSize must divide training.globalBatchSize",
            "fieldPath": ".strategy.microBatchSize",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!has(self.data) || !(has(self.data.huggingface) || has(self.data.files)) || "
            "has(self.problem.huggingface)",
            "message": DATA_NEEDS_HF_MODEL,
            "fieldPath": ".data",
            "reason": "FieldValueForbidden",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.problem": [
        {
            "rule": "(has(self.builtin) ? 1 : 0) + (has(self.huggingface) ? 1 : 0) + "
            "(has(self.entrypoint) ? 1 : 0) == 1",
            "message": "exactly one of builtin, huggingface or entrypoint must be set",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.problem.huggingface": [
        {
            "rule": "has(self.volumeClaim) == has(self.path)",
            "message": "volumeClaim and path go together: the PersistentVolumeClaim and the save_pretrained "
            "folder on it",
            "fieldPath": ".path",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "has(self.model) || has(self.volumeClaim)",
            "message": "model (a hub id) is required without volumeClaim",
            "fieldPath": ".model",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "!has(self.volumeClaim) || !has(self.tokenSecretRef)",
            "message": TOKEN_WITH_VOLUME,
            "fieldPath": ".tokenSecretRef",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.volumeClaim) || !has(self.revision)",
            "message": REVISION_WITH_VOLUME,
            "fieldPath": ".revision",
            "reason": "FieldValueForbidden",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.data": [
        {
            "rule": "(has(self.huggingface) ? 1 : 0) + (has(self.files) ? 1 : 0) + "
            "((has(self.synthetic) && self.synthetic) ? 1 : 0) == 1",
            "message": "exactly one of huggingface, files or synthetic: true must be set",
        },
        {
            "rule": "!has(self.textField) || !has(self.messagesField)",
            "message": "set textField or messagesField, not both",
            "fieldPath": ".messagesField",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.evalSplit) || has(self.huggingface)",
            "message": EVAL_SPLIT_NEEDS_HUB,
            "fieldPath": ".evalSplit",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.evalPath) || has(self.files)",
            "message": EVAL_PATH_NEEDS_FILES,
            "fieldPath": ".evalPath",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.evalEverySteps) || self.evalEverySteps <= 0 || has(self.evalSplit) || "
            "has(self.evalPath)",
            "message": EVAL_EVERY_NEEDS_SET,
            "fieldPath": ".evalEverySteps",
            "reason": "FieldValueInvalid",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.problem.builtin": [
        {
            "rule": "self.hidden % self.heads == 0",
            "message": "hidden must be divisible by heads",
            "fieldPath": ".heads",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "self.kind != 'vit' || !has(self.imageSize) || !has(self.patchSize) || "
            "self.imageSize % self.patchSize == 0",
            "message": "imageSize must be divisible by patchSize",
            "fieldPath": ".patchSize",
            "reason": "FieldValueInvalid",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.training.checkpoint": [
        {
            "rule": "!has(self.emptyDir) || !self.emptyDir || !has(self.volumeClaim) || self.volumeClaim == ''",
            "message": "volumeClaim and emptyDir exclude each other: name a claim or ask for an emptyDir",
            "fieldPath": ".emptyDir",
            "reason": "FieldValueForbidden",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.strategy": [
        {
            "rule": "!has(self.zeroStage) || (type(self.zeroStage) == string ? self.zeroStage == 'auto' : "
            "(int(self.zeroStage) >= 0 && int(self.zeroStage) <= 3))",
            "message": "zeroStage must be auto or 0, 1, 2, 3",
            "fieldPath": ".zeroStage",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!has(self.microBatchSize) || (type(self.microBatchSize) == string ? "
            "self.microBatchSize == 'auto' : (int(self.microBatchSize) >= 1 && "
            "int(self.microBatchSize) <= 65536))",
            "message": "microBatchSize must be auto or 1..65536",
            "fieldPath": ".microBatchSize",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!has(self.offload) || self.offload != 'nvme' || !has(self.engine) || "
            "self.engine in ['auto', 'deepspeed']",
            "message": "offload nvme needs engine deepspeed or auto",
            "fieldPath": ".offload",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.engine) || self.engine != 'ddp' || !has(self.zeroStage) || "
            "type(self.zeroStage) == string || int(self.zeroStage) == 0",
            "message": "engine ddp does not shard: zeroStage must be auto or 0 (use fsdp or deepspeed)",
            "fieldPath": ".zeroStage",
            "reason": "FieldValueForbidden",
        },
        {
            "rule": "!has(self.engine) || self.engine != 'ddp' || !has(self.offload) || "
            "self.offload in ['auto', 'none']",
            "message": "engine ddp cannot offload: offload must be auto or none",
            "fieldPath": ".offload",
            "reason": "FieldValueForbidden",
        },
    ],
    "MemoryOptimizedTrainingJob.spec.strategy.peft": [
        {
            "rule": "!has(self.method) || self.method != 'auto' || (has(self.allowed) && size(self.allowed) > 0)",
            "message": "peft method auto needs a non-empty allowed list: any of none, lora, qlora",
            "fieldPath": ".allowed",
            "reason": "FieldValueRequired",
        },
        {
            "rule": "!has(self.allowed) || size(self.allowed) == 0 || (has(self.method) && self.method == 'auto')",
            "message": "peft allowed applies only to method auto",
            "fieldPath": ".allowed",
            "reason": "FieldValueForbidden",
        },
    ],
}
CEL_RULES.update(POD_TEMPLATE_CEL_RULES)
CEL_RULES["GPUNodePool.spec.gpu.mig"] = MIG_CEL_RULES
for _path, _rules in OWN_CODE_CEL_RULES.items():
    CEL_RULES[_path] = CEL_RULES.get(_path, []) + _rules
# A path on a volume claim is relative and has no `..` segment (`finetune_rules.escapes`, same regex).
CEL_RULES.update({
    f"MemoryOptimizedTrainingJob.{field_path}": [
        {"rule": f"!self.matches('{ESCAPING_PATH}')", "message": inside_volume(field_path)}]
    for field_path in VOLUME_PATHS
})


def _inline(node: Any, defs: dict[str, Schema]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            rest = {k: v for k, v in node.items() if k != "$ref"}
            target.update(rest)
            return _inline(target, defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _structural(node: Schema, *, path: str, keep_defaults: bool) -> Schema:
    """Turn one pydantic JSON-schema node into a Kubernetes structural-schema node."""
    node = dict(node)
    node.pop("title", None)
    if node.pop("x-kubernetes-int-or-string", False):
        out: Schema = {"x-kubernetes-int-or-string": True}
        if keep_defaults and "default" in node:
            out["default"] = node["default"]
        if "description" in node:
            out["description"] = node["description"]
        return out
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"{path}: unions other than Optional need x-kubernetes-int-or-string")
        merged = {**options[0], **{k: v for k, v in node.items() if k != "default" or v is not None}}
        return _structural(merged, path=path, keep_defaults=keep_defaults)
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    preserve = node.pop("x-kubernetes-preserve-unknown-fields", False)
    out = {
        k: v
        for k, v in node.items()
        if k
        in (
            "type",
            "description",
            "enum",
            "format",
            "pattern",
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "maxProperties",
        )
    }
    if "exclusiveMinimum" in node:
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if keep_defaults and "default" in node and node["default"] is not None:
        out["default"] = node["default"]
    kind = node.get("type")
    if preserve:
        out = {k: v for k, v in out.items() if k in ("description",)}
        out.update({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        return out
    if kind == "object":
        props = node.get("properties")
        if props:
            out["properties"] = {
                name: _structural(sub, path=f"{path}.{name}", keep_defaults=keep_defaults)
                for name, sub in props.items()
            }
            required = node.get("required")
            if required:
                out["required"] = required
            if keep_defaults:
                # `default: {}` lets the API server fill nested defaults; only for sections that always
                # exist (not Optional in the model) and have no required fields of their own.
                for name, sub in out["properties"].items():
                    optional = any(o.get("type") == "null" for o in props[name].get("anyOf", []))
                    if (
                        sub.get("type") == "object"
                        and "properties" in sub
                        and not sub.get("required")
                        and not optional
                        and name not in (required or [])
                    ):
                        sub.setdefault("default", {})
        else:
            extra = node.get("additionalProperties", {"type": "string"})
            out["additionalProperties"] = _structural(extra, path=f"{path}.*", keep_defaults=False)
            out.setdefault("maxProperties", DEFAULT_MAX_PROPERTIES)
    elif kind == "array":
        out["items"] = _structural(node["items"], path=f"{path}[]", keep_defaults=keep_defaults)
        out.setdefault("maxItems", DEFAULT_MAX_ITEMS)
    elif kind == "string" and "enum" not in out and out.get("format") != "date-time":
        out.setdefault("maxLength", DEFAULT_MAX_LENGTH)
    rules = CEL_RULES.get(path)
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def model_openapi(model: type[BaseModel], *, path: str, keep_defaults: bool) -> Schema:
    """Structural OpenAPI v3 schema for one pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(_inline(raw, defs), path=path, keep_defaults=keep_defaults)


def _crd(
    *,
    kind: str,
    plural: str,
    short: str,
    scope: str,
    spec: Schema,
    status: Schema,
    description: str,
    columns: list[dict[str, Any]],
    root_rules: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    root: Schema = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of the object."},
            "kind": {"type": "string", "description": "Kind of the object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if root_rules:
        root["x-kubernetes-validations"] = root_rules
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{API_GROUP}",
            "labels": {"app.kubernetes.io/name": "memfit", "app.kubernetes.io/part-of": "memfit"},
        },
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["memfit"],
            },
            "scope": scope,
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def _col(name: str, path: str, kind: str = "string", priority: int = 0, desc: str = "") -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        col["priority"] = priority
    if desc:
        col["description"] = desc
    return col


def build_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD object, for `crds/` and the chart."""
    motj_columns = [
        _col("Phase", ".status.phase"),
        _col("Pool", ".status.plan.nodePool"),
        _col("GPUs", ".status.plan.gpus", "integer"),
        _col("Precision", ".status.plan.precision"),
        _col("ZeRO", ".status.plan.zeroStage", "integer"),
        _col("Predicted", ".status.plan.predictedPeak", desc="Predicted per-GPU peak memory"),
        _col("$/h", ".status.plan.costPerHourText", desc="Plan price per hour"),
        _col("Savings", ".status.plan.savings", desc="Cost change against the baseline"),
        _col("Step", ".status.progress.steps", desc="Last optimizer step / maxSteps"),
        _col("Loss", ".status.progress.loss", "number", desc="Training loss of the last step"),
        _col("ETA", ".status.progress.eta", desc="Time to maxSteps at the mean step time"),
        _col("Age", ".metadata.creationTimestamp", "date"),
        _col("Engine", ".status.plan.engine", priority=1),
        _col("MicroBatch", ".status.plan.microBatchSize", "integer", priority=1),
        _col("PEFT", ".status.plan.peft", priority=1, desc="none, lora or qlora"),
        _col("Message", ".status.message", priority=1),
    ]
    pool_columns = [
        _col("GPU", ".spec.gpu.product"),
        _col("PerNode", ".spec.gpu.perNode", "integer"),
        _col("$/Node-h", ".spec.pricePerNodeHour", "number"),
        _col("Capacity", ".spec.capacityType"),
        _col("Nodes", ".status.nodes", "integer"),
        _col("Ready", ".status.readyNodes", "integer"),
        _col("FreeGPUs", ".status.freeGpus", "integer"),
        _col("Age", ".metadata.creationTimestamp", "date"),
        _col("MemoryMiB", ".spec.gpu.memoryMiB", "integer", priority=1),
        _col("MaxNodes", ".spec.maxNodes", "integer", priority=1),
    ]
    return {
        "memfit.dev_memoryoptimizedtrainingjobs.yaml": _crd(
            kind="MemoryOptimizedTrainingJob",
            plural="memoryoptimizedtrainingjobs",
            short="motj",
            scope="Namespaced",
            spec=model_openapi(
                MemoryOptimizedTrainingJobSpec, path="MemoryOptimizedTrainingJob.spec", keep_defaults=True
            ),
            status=model_openapi(
                MemoryOptimizedTrainingJobStatus,
                path="MemoryOptimizedTrainingJob.status",
                keep_defaults=False,
            ),
            description="A training job that memfit profiles, fits in GPU memory at the lowest cost, "
            "launches and re-plans.",
            columns=motj_columns,
            root_rules=[
                {
                    "rule": f"self.metadata.name.size() <= {MAX_JOB_NAME}",
                    "message": f"metadata.name must be at most {MAX_JOB_NAME} characters so that child names "
                    "(<name>-train-<attempt>-<index>) stay valid DNS labels",
                }
            ],
        ),
        "memfit.dev_gpunodepools.yaml": _crd(
            kind="GPUNodePool",
            plural="gpunodepools",
            short="gpupool",
            scope="Cluster",
            spec=model_openapi(GPUNodePoolSpec, path="GPUNodePool.spec", keep_defaults=True),
            status=model_openapi(GPUNodePoolStatus, path="GPUNodePool.status", keep_defaults=False),
            description="A pool of identical GPU nodes with a price, used by memfit's planner.",
            columns=pool_columns,
        ),
    }

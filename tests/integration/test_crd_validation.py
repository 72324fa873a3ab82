"""The real API server rejects invalid MOTJs through the generated CRD schema: one case per CEL rule
(the fine-tune ones naming the field, in the operator's words), plus schema bounds, and accepts every
example."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from memfit.api.finetune_rules import (
    DATA_NEEDS_HF_MODEL,
    EVAL_EVERY_NEEDS_SET,
    EVAL_PATH_NEEDS_FILES,
    EVAL_SPLIT_NEEDS_HUB,
    REVISION_WITH_VOLUME,
    TOKEN_WITH_VOLUME,
    inside_volume,
)
from memfit_testbed.cluster_helpers import Kube

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def job(name: str, **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"] = {"name": name}
    for key, value in spec.items():
        doc["spec"][key] = value
    return doc


CEL_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "exactly one problem source": (
        {"problem": {"entrypoint": "pkg.train:problem", "builtin": QUICKSTART["spec"]["problem"]["builtin"]}},
        "exactly one of builtin, huggingface or entrypoint",
    ),
    "no problem source": ({"problem": {}}, "exactly one of builtin, huggingface or entrypoint"),
    "heads divide hidden": (
        {"problem": {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 3}}},
        "hidden must be divisible by heads",
    ),
    "patch divides image": (
        {
            "problem": {
                "builtin": {
                    "kind": "vit",
                    "layers": 2,
                    "hidden": 64,
                    "heads": 4,
                    "imageSize": 100,
                    "patchSize": 16,
                }
            }
        },
        "imageSize must be divisible by patchSize",
    ),
    "micro-batch divides global batch": (
        {"training": {"globalBatchSize": 10}, "strategy": {"microBatchSize": 4}},
        "microBatchSize must divide training.globalBatchSize",
    ),
    "zero stage range": ({"strategy": {"zeroStage": 4}}, "zeroStage must be auto or 0, 1, 2, 3"),
    "zero stage word": ({"strategy": {"zeroStage": "max"}}, "zeroStage must be auto or 0, 1, 2, 3"),
    "micro-batch range": ({"strategy": {"microBatchSize": 0}}, "microBatchSize must be auto or 1..65536"),
    "nvme needs deepspeed": (
        {"strategy": {"engine": "fsdp", "offload": "nvme"}},
        "offload nvme needs engine deepspeed",
    ),
    "ddp does not shard": ({"strategy": {"engine": "ddp", "zeroStage": 3}}, "engine ddp does not shard"),
    "ddp does not offload": ({"strategy": {"engine": "ddp", "offload": "cpu"}}, "engine ddp cannot offload"),
    "peft auto needs allowed": ({"strategy": {"peft": {"method": "auto"}}}, "peft method auto needs a non-empty"),
    "checkpoint claim or emptyDir": (
        {"training": {"checkpoint": {"volumeClaim": "ckpt", "emptyDir": True}}},
        "volumeClaim and emptyDir exclude each other",
    ),
    "peft allowed needs auto": ({"strategy": {"peft": {"method": "lora", "allowed": ["qlora"]}}},
                                "peft allowed applies only to method auto"),
}


@pytest.mark.parametrize(("spec", "message"), CEL_CASES.values(), ids=CEL_CASES.keys())
def test_cel_rule_rejects(
    kube: Kube, namespace: str, install_crds: list[str], spec: dict[str, Any], message: str
) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(
            "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", job("bad", **spec)
        )
    assert error.value.status == 422
    assert message in error.value.body


VOLUME_MODEL = {"volumeClaim": "models", "path": "llama-1b"}
FILES = {"volumeClaim": "corpus", "path": "train.jsonl"}
# The fine-tune rules docs/finetune.md says admission enforces: (spec, the field the API server names, the
# words of its message: the operator's own, memfit.api.finetune_rules).
FINETUNE_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "model path with ..": ({"problem": {"huggingface": {**VOLUME_MODEL, "path": "../etc"}}},
                           "spec.problem.huggingface.path", inside_volume("spec.problem.huggingface.path")),
    "model path with .. inside": ({"problem": {"huggingface": {**VOLUME_MODEL, "path": "models/../../etc"}}},
                                  "spec.problem.huggingface.path", inside_volume("spec.problem.huggingface.path")),
    "model path absolute": ({"problem": {"huggingface": {**VOLUME_MODEL, "path": "/etc"}}},
                            "spec.problem.huggingface.path", inside_volume("spec.problem.huggingface.path")),
    "token with a volume": ({"problem": {"huggingface": {**VOLUME_MODEL, "tokenSecretRef": {"name": "hub"}}}},
                            "spec.problem.huggingface.tokenSecretRef", TOKEN_WITH_VOLUME),
    "revision with a volume": ({"problem": {"huggingface": {**VOLUME_MODEL, "revision": "main"}}},
                               "spec.problem.huggingface.revision", REVISION_WITH_VOLUME),
    "files path with ..": ({"problem": {"huggingface": VOLUME_MODEL},
                            "data": {"files": {**FILES, "path": "a/../../b.jsonl"}}},
                           "spec.data.files.path", inside_volume("spec.data.files.path")),
    "eval path absolute": ({"problem": {"huggingface": VOLUME_MODEL},
                            "data": {"files": FILES, "evalPath": "/etc/eval.jsonl"}},
                           "spec.data.evalPath", inside_volume("spec.data.evalPath")),
    "output path absolute": ({"output": {"volumeClaim": "out", "path": "/etc"}}, "spec.output.path",
                             inside_volume("spec.output.path")),
    "output path with ..": ({"output": {"volumeClaim": "out", "path": ".."}}, "spec.output.path",
                            inside_volume("spec.output.path")),
    "evalSplit on files": ({"problem": {"huggingface": VOLUME_MODEL}, "data": {"files": FILES, "evalSplit": "test"}},
                           "spec.data.evalSplit", EVAL_SPLIT_NEEDS_HUB),
    "evalPath on a hub dataset": ({"problem": {"huggingface": VOLUME_MODEL},
                                   "data": {"huggingface": {"name": "org/set"}, "evalPath": "eval.jsonl"}},
                                  "spec.data.evalPath", EVAL_PATH_NEEDS_FILES),
    "evalEverySteps without an eval set": ({"problem": {"huggingface": VOLUME_MODEL},
                                            "data": {"files": FILES, "evalEverySteps": 10}},
                                           "spec.data.evalEverySteps", EVAL_EVERY_NEEDS_SET),
    "dataset for a builtin": ({"data": {"files": FILES}}, "spec.data", DATA_NEEDS_HF_MODEL),
    "volumeClaim without path": ({"problem": {"huggingface": {"volumeClaim": "models"}}},
                                 "spec.problem.huggingface.path", "volumeClaim and path go together"),
    "no model source": ({"problem": {"huggingface": {"sequenceLength": 16}}}, "spec.problem.huggingface.model",
                        "model (a hub id) is required without volumeClaim"),
    "two data sources": ({"problem": {"huggingface": VOLUME_MODEL}, "data": {"files": FILES, "synthetic": True}},
                         "spec.data", "exactly one of huggingface, files or synthetic: true"),
    "text and messages": ({"problem": {"huggingface": VOLUME_MODEL},
                           "data": {"files": FILES, "textField": "t", "messagesField": "m"}},
                          "spec.data.messagesField", "set textField or messagesField, not both"),
}


@pytest.mark.parametrize(("spec", "field", "message"), FINETUNE_CASES.values(), ids=FINETUNE_CASES.keys())
def test_finetune_rule_rejects_naming_the_field(
    kube: Kube, namespace: str, install_crds: list[str], spec: dict[str, Any], field: str, message: str
) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(
            "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", job("bad", **spec)
        )
    assert error.value.status == 422
    causes = json.loads(error.value.body)["details"]["causes"]
    assert any(c.get("field") == field and message in c.get("message", "") for c in causes), causes


def test_finetune_example_is_accepted(kube: Kube, namespace: str, install_crds: list[str]) -> None:
    doc = yaml.safe_load((REPO / "examples" / "finetune-tiny.yaml").read_text())
    doc["metadata"].pop("namespace", None)
    created = client.CustomObjectsApi(kube.api_client).create_namespaced_custom_object(
        "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", doc
    )
    assert created["spec"]["problem"]["huggingface"]["path"] == doc["spec"]["problem"]["huggingface"]["path"]
    assert created["spec"]["output"]["path"] == doc["spec"]["output"]["path"]


def test_name_length_rule(kube: Kube, namespace: str, install_crds: list[str]) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(
            "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", job("x" * 41)
        )
    assert "at most 40 characters" in error.value.body


SCHEMA_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "unknown enum": ({"strategy": {"precision": "int8"}}, "spec.strategy.precision"),
    "negative layers": (
        {"problem": {"builtin": {"kind": "gpt", "layers": -1, "hidden": 64, "heads": 4}}},
        "spec.problem.builtin.layers",
    ),
    "huge headroom": ({"objective": {"memoryHeadroomPercent": 1000}}, "spec.objective.memoryHeadroomPercent"),
    "too many pools": (
        {"placement": {"nodePools": [f"p{i}" for i in range(33)]}},
        "spec.placement.nodePools",
    ),
    "long image": ({"image": "x" * 600}, "spec.image"),
    "unknown peft method": ({"strategy": {"peft": {"method": "prefix-tuning"}}}, "spec.strategy.peft.method"),
    "lora rank 0": ({"strategy": {"peft": {"method": "lora", "lora": {"rank": 0}}}}, "spec.strategy.peft.lora.rank"),
}


@pytest.mark.parametrize(("spec", "field"), SCHEMA_CASES.values(), ids=SCHEMA_CASES.keys())
def test_schema_bounds_reject(
    kube: Kube, namespace: str, install_crds: list[str], spec: dict[str, Any], field: str
) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(
            "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", job("bad", **spec)
        )
    assert error.value.status == 422 and field in error.value.body


def test_examples_are_accepted_and_defaulted(kube: Kube, namespace: str, install_crds: list[str]) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    for path in ("quickstart.yaml", "llama-finetune.yaml", "llama-8b-lora.yaml", "llama-70b-qlora.yaml"):
        doc = yaml.safe_load((REPO / "examples" / path).read_text())
        doc["metadata"].pop("namespace", None)
        created = custom.create_namespaced_custom_object(
            "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", doc
        )
        # Defaults applied by the API server (an example may pin the engine, e.g. the 70B QLoRA's DDP).
        assert created["spec"]["strategy"]["engine"] == (doc["spec"].get("strategy") or {}).get("engine", "auto")
        assert created["spec"]["profiling"]["reuse"] is True
    pools = list(yaml.safe_load_all((REPO / "examples" / "gpunodepools.yaml").read_text()))
    for pool in pools:
        pool["metadata"]["name"] = f"{namespace[:40]}-{pool['metadata']['name']}"[:63]
        custom.create_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools", pool)
        custom.delete_cluster_custom_object(
            "memfit.dev", "v1alpha1", "gpunodepools", pool["metadata"]["name"]
        )

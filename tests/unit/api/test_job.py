"""MOTJ model: examples validate, bad specs name the field and the allowed values."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from memfit.api import MemoryOptimizedTrainingJob
from memfit.api.validation import load_file, validate_document

REPO = Path(__file__).resolve().parents[3]


def make_job(**spec: Any) -> dict[str, Any]:
    """A minimal valid MOTJ document, with spec sections overridden."""
    doc: dict[str, Any] = {
        "apiVersion": "memfit.dev/v1alpha1",
        "kind": "MemoryOptimizedTrainingJob",
        "metadata": {"name": "t"},
        "spec": {"problem": {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}}},
    }
    doc["spec"].update(copy.deepcopy(spec))
    return doc


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_validates(path: Path) -> None:
    loaded, problems = load_file(path)
    assert problems == []
    assert loaded


def test_checkpoint_interval_unset_is_left_to_memfit_and_a_pinned_one_is_kept() -> None:
    assert MemoryOptimizedTrainingJob.model_validate(make_job()).spec.training.checkpoint.every_steps is None
    pinned = MemoryOptimizedTrainingJob.model_validate(make_job(training={"checkpoint": {"everySteps": 500}}))
    assert pinned.spec.training.checkpoint.every_steps == 500
    assert pinned.to_wire()["spec"]["training"]["checkpoint"]["everySteps"] == 500  # type: ignore[index]


def test_defaults_are_auto() -> None:
    job = MemoryOptimizedTrainingJob.model_validate(make_job())
    s = job.spec.strategy
    assert (s.engine, s.precision, s.zero_stage, s.micro_batch_size) == ("auto", "auto", "auto", "auto")
    assert job.spec.objective.memory_headroom_percent == 10
    assert job.spec.recovery.max_replans == 3


def test_wire_round_trip_is_camel_case() -> None:
    job = MemoryOptimizedTrainingJob.model_validate(make_job(strategy={"zeroStage": 2, "microBatchSize": 4}))
    wire = job.to_wire()
    assert wire["spec"]["strategy"]["zeroStage"] == 2
    assert "optimizer8bit" in wire["spec"]["strategy"]
    assert MemoryOptimizedTrainingJob.model_validate(wire) == job


CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "no problem source": (
        {"problem": {}},
        "spec.problem",
        "exactly one of builtin, huggingface or entrypoint",
    ),
    "two problem sources": (
        {"problem": {"entrypoint": "a:b", "builtin": {"kind": "gpt", "layers": 1, "hidden": 64, "heads": 4}}},
        "spec.problem",
        "got builtin, entrypoint",
    ),
    "heads do not divide hidden": (
        {"problem": {"builtin": {"kind": "gpt", "layers": 1, "hidden": 100, "heads": 3}}},
        "spec.problem.builtin.heads",
        "divisible by heads",
    ),
    "unknown model kind": (
        {"problem": {"builtin": {"kind": "resnet", "layers": 1, "hidden": 64, "heads": 4}}},
        "spec.problem.builtin.kind",
        "'gpt', 'bert' or 'vit'",
    ),
    "negative layers": (
        {"problem": {"builtin": {"kind": "gpt", "layers": -2, "hidden": 64, "heads": 4}}},
        "spec.problem.builtin.layers",
        "greater than or equal to 1",
    ),
    "micro-batch does not divide global": (
        {"training": {"globalBatchSize": 10}, "strategy": {"microBatchSize": 4}},
        "spec.strategy.microBatchSize",
        "must divide training.globalBatchSize (10)",
    ),
    "zero stage 5": ({"strategy": {"zeroStage": 5}}, "spec.strategy.zeroStage", "auto or an integer 0..3"),
    "zero stage word": ({"strategy": {"zeroStage": "two"}}, "spec.strategy.zeroStage", "got 'two'"),
    "nvme with fsdp": (
        {"strategy": {"engine": "fsdp", "offload": "nvme"}},
        "spec.strategy.offload",
        "nvme needs engine deepspeed",
    ),
    "bf16-pure on deepspeed": (
        {"strategy": {"engine": "deepspeed", "precision": "bf16-pure"}},
        "spec.strategy.precision",
        "bf16-pure runs on engine ddp, fsdp or auto; engine is deepspeed",
    ),
    "bf16-pure with cpu offload": (
        {"strategy": {"precision": "bf16-pure", "offload": "cpu"}},
        "spec.strategy.precision",
        "offload is cpu",
    ),
    "optimizer in backward on fsdp": (
        {"strategy": {"optimizerInBackward": "enabled", "engine": "fsdp"}},
        "spec.strategy.optimizerInBackward",
        "engine ddp or auto (one GPU); engine is fsdp",
    ),
    "optimizer in backward with fp16": (
        {"strategy": {"optimizerInBackward": "enabled", "precision": "fp16"}},
        "spec.strategy.optimizerInBackward",
        "cannot unscale fp16 gradients",
    ),
    "optimizer in backward with accumulation": (
        {"strategy": {"optimizerInBackward": "enabled", "microBatchSize": 2}, "training": {"globalBatchSize": 8}},
        "spec.strategy.optimizerInBackward",
        "microBatchSize (2) must equal training.globalBatchSize (8)",
    ),
    "chunked loss on a vit": (
        {"problem": {"builtin": {"kind": "vit"}}, "strategy": {"chunkedLoss": "enabled"}},
        "spec.strategy.chunkedLoss",
        "no language-model head",
    ),
    "masked-lm head on a llama": (
        {"problem": {"huggingface": {"model": "m/llama", "task": "masked-lm", "config": {"model_type": "llama"}}}},
        "spec.problem.huggingface.task",
        "llama has no masked-lm head in transformers (allowed: auto, causal-lm, sequence-classification)",
    ),
    "chunked loss on a classifier": (
        {"problem": {"huggingface": {"model": "m/bert", "task": "sequence-classification"}},
         "strategy": {"chunkedLoss": "enabled"}},
        "spec.strategy.chunkedLoss",
        "spec.problem.huggingface.task is sequence-classification: set it to auto or disabled",
    ),
    "classification on unlabelled data": (
        {"problem": {"huggingface": {"model": "m/bert", "task": "sequence-classification"}},
         "data": {"files": {"volumeClaim": "data", "path": "train.jsonl"}}},
        "spec.problem.huggingface.task",
        "synthetic labels only",
    ),
    "unknown attention": (
        {"problem": {"huggingface": {"model": "m/bert", "attention": "fast"}}},
        "spec.problem.huggingface.attention",
        "'auto', 'eager', 'sdpa' or 'flash'",
    ),
    "optimizer implementation with 8-bit": (
        {"strategy": {"optimizerImplementation": "foreach", "optimizer8bit": "enabled"}},
        "spec.strategy.optimizerImplementation",
        "optimizerImplementation foreach picks torch's 32-bit step; optimizer8bit is enabled",
    ),
    "optimizer implementation with bf16-pure": (
        {"strategy": {"optimizerImplementation": "fused", "precision": "bf16-pure"}},
        "spec.strategy.optimizerImplementation",
        "precision is bf16-pure",
    ),
    "optimizer implementation with offload": (
        {"strategy": {"optimizerImplementation": "for-loop", "engine": "deepspeed", "offload": "cpu"}},
        "spec.strategy.optimizerImplementation",
        "offload is cpu",
    ),
    "selective-op with LoRA only": (
        {"strategy": {"activationCheckpointing": "selective-op", "peft": {"method": "lora"}}},
        "spec.strategy.activationCheckpointing",
        "activationCheckpointing selective-op trains a full fine-tune",
    ),
    "activation offload with LoRA only": (
        {"strategy": {"activationOffload": "enabled", "peft": {"method": "lora"}}},
        "spec.strategy.activationOffload",
        "activationOffload enabled trains a full fine-tune: peft must allow none",
    ),
    "activation offload of an entrypoint": (
        {"problem": {"entrypoint": "my.train:problem"},
         "strategy": {"activationOffload": "enabled"}},
        "spec.strategy.activationOffload",
        "a job's own code or entrypoint keeps its activations as it does: set it to auto or disabled",
    ),
    "unknown activation offload": (
        {"strategy": {"activationOffload": "on"}},
        "spec.strategy.activationOffload",
        "'auto', 'enabled' or 'disabled'",
    ),
    "unknown optimizer implementation": (
        {"strategy": {"optimizerImplementation": "apex"}},
        "spec.strategy.optimizerImplementation",
        "'auto', 'fused', 'foreach' or 'for-loop'",
    ),
    "ddp with zero-3": (
        {"strategy": {"engine": "ddp", "zeroStage": 3}},
        "spec.strategy.zeroStage",
        "ddp does not shard",
    ),
    "unknown field": ({"trainingg": {}}, "spec.trainingg", "unknown field"),
    "bad precision": (
        {"strategy": {"precision": "int8"}},
        "spec.strategy.precision",
        "'auto', 'fp32', 'bf16', 'fp16' or 'bf16-pure'",
    ),
    "headroom too large": (
        {"objective": {"memoryHeadroomPercent": 500}},
        "spec.objective.memoryHeadroomPercent",
        "less than or equal to 90",
    ),
    "too many pools": (
        {"placement": {"nodePools": [f"p{i}" for i in range(40)]}},
        "spec.placement.nodePools",
        "at most 32",
    ),
    "pool name not a DNS label": (
        {"placement": {"nodePools": ["Big_Pool"]}},
        "spec.placement.nodePools[0]",
        "should match pattern",
    ),
    "kueue queue of another namespace": (
        {"scheduling": {"kueueQueue": "team-b/gpu"}},
        "spec.scheduling.kueueQueue",
        "LocalQueues are namespaced: a job can only use one of its own namespace",
    ),
    "kueue queue in unicode": (
        {"scheduling": {"kueueQueue": "q\u202eeueu"}},
        "spec.scheduling.kueueQueue",
        "must be the name of a LocalQueue in the job's namespace",
    ),
    "kueue queue ending in a dash": (
        {"scheduling": {"kueueQueue": "q-"}},
        "spec.scheduling.kueueQueue",
        "must be the name of a LocalQueue in the job's namespace",
    ),
    "kueue queue with an underscore (no LocalQueue can have it)": (
        {"scheduling": {"kueueQueue": "team_a"}},
        "spec.scheduling.kueueQueue",
        "must be the name of a LocalQueue in the job's namespace",
    ),
    "checkpoint interval of zero steps": (
        {"training": {"checkpoint": {"everySteps": 0}}},
        "spec.training.checkpoint.everySteps",
        "greater than or equal to 1",
    ),
    "kueue queue not a name": (
        {"scheduling": {"kueueQueue": "GPU Queue"}},
        "spec.scheduling.kueueQueue",
        "must be the name of a LocalQueue in the job's namespace",
    ),
}


@pytest.mark.parametrize(("spec", "path", "text"), CASES.values(), ids=CASES.keys())
def test_bad_spec_names_the_field(spec: dict[str, Any], path: str, text: str) -> None:
    loaded, problems = validate_document(make_job(**spec), "job.yaml")
    assert loaded is None
    matching = [p for p in problems if p.path == path]
    assert matching, f"no violation at {path}: {[str(p) for p in problems]}"
    assert any(text in p.message for p in matching), [str(p) for p in matching]


def test_every_violation_is_reported_at_once() -> None:
    spec = {
        "problem": {
            "builtin": {"kind": "gpt2", "layers": -1, "hidden": 100, "heads": 3},
            "entrypoint": "x:y",
        },
        "strategy": {"engine": "ddp", "zeroStage": 3, "precision": "int8"},
    }
    _, problems = validate_document(make_job(**spec), "job.yaml")
    paths = {p.path for p in problems}
    assert {
        "spec.problem",
        "spec.problem.builtin.kind",
        "spec.problem.builtin.layers",
        "spec.problem.builtin.heads",
        "spec.strategy.zeroStage",
        "spec.strategy.precision",
    } <= paths


def test_unknown_kind_lists_allowed_kinds() -> None:
    _, problems = validate_document({"kind": "TrainJob"}, "x.yaml")
    assert problems[0].path == "kind"
    assert "MemoryOptimizedTrainingJob, GPUNodePool" in problems[0].message


def test_gpunodepool_negative_price_rejected() -> None:
    doc = yaml.safe_load((REPO / "examples" / "gpunodepools.yaml").read_text().split("---")[1])
    doc["spec"]["pricePerNodeHour"] = -1
    _, problems = validate_document(doc, "pools.yaml")
    assert [p.path for p in problems] == ["spec.pricePerNodeHour"]

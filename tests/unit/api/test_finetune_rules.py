"""Fine-tune rules (model source, spec.data, output): each violation with its field path, and the defaults."""

from __future__ import annotations

import re
from typing import Any

import pytest
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.problem import HuggingFaceProblem, Initialize
from memfit.api.rules import check_spec

VOLUME_MODEL = {"volumeClaim": "models", "path": "llama-1b"}
FILES = {"files": {"volumeClaim": "data", "path": "train.jsonl"}}


def spec(hf: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    problem = {"huggingface": hf} if hf is not None else {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64,
                                                                      "heads": 4}}
    return {"problem": problem, **sections}


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (spec({"volumeClaim": "models"}), "spec.problem.huggingface.path", "volumeClaim needs path"),
        (spec({"model": "a/b", "path": "x"}), "spec.problem.huggingface.volumeClaim", "path needs volumeClaim"),
        (spec({"sequenceLength": 16}), "spec.problem.huggingface.model", "required without volumeClaim"),
        (spec({**VOLUME_MODEL, "path": "../other"}), "spec.problem.huggingface.path", "no `..` segment"),
        (spec({**VOLUME_MODEL, "tokenSecretRef": {"name": "t"}}), "spec.problem.huggingface.tokenSecretRef",
         "is for hub downloads"),
        (spec(VOLUME_MODEL, data={**FILES, "synthetic": True}), "spec.data",
         "exactly one of huggingface, files or synthetic: true must be set; got files, synthetic"),
        (spec(VOLUME_MODEL, data={"textField": "text"}), "spec.data", "got none"),
        (spec(VOLUME_MODEL, data={**FILES, "textField": "t", "messagesField": "m"}), "spec.data.messagesField",
         "not both"),
        (spec(VOLUME_MODEL, data={**FILES, "evalSplit": "validation"}), "spec.data.evalSplit", "use evalPath"),
        (spec(VOLUME_MODEL, data={"huggingface": {"name": "x/y"}, "evalPath": "e.jsonl"}), "spec.data.evalPath",
         "use evalSplit"),
        (spec(VOLUME_MODEL, data={**FILES, "evalEverySteps": 50}), "spec.data.evalEverySteps", "needs an eval set"),
        (spec(data=FILES), "spec.data", "needs problem.huggingface"),
        (spec(VOLUME_MODEL, output={"volumeClaim": "out", "path": "a/../../b"}), "spec.output.path", "no `..`"),
    ],
    ids=["claim without path", "path without claim", "no source", "path escapes", "token with volume",
         "two data sources", "no data source", "text and messages", "evalSplit on files", "evalPath on hub",
         "evalEvery without eval", "data on builtin", "output escapes"],
)
def test_violations_name_the_field(raw: dict[str, Any], path: str, words: str) -> None:
    found = check_spec(raw)
    assert any(p == path and words in m for p, m in found), found
    with pytest.raises(ValueError, match=re.escape(path)):
        MemoryOptimizedTrainingJobSpec.model_validate(raw)


@pytest.mark.parametrize(
    ("hf", "expected"),
    [
        ({"model": "meta-llama/Llama-3.2-1B", "config": {"model_type": "llama"}}, Initialize.RANDOM),
        ({"model": "meta-llama/Llama-3.2-1B"}, Initialize.PRETRAINED),
        ({**VOLUME_MODEL, "config": {"model_type": "llama"}}, Initialize.PRETRAINED),
        ({"model": "m/x", "config": {"model_type": "llama"}, "initialize": "pretrained"}, Initialize.PRETRAINED),
        ({**VOLUME_MODEL, "initialize": "random"}, Initialize.RANDOM),
    ],
    ids=["inline config keeps random init", "hub model", "volume with planning config", "explicit pretrained",
         "explicit random"],
)
def test_initialize_default(hf: dict[str, Any], expected: Initialize) -> None:
    assert HuggingFaceProblem.model_validate(hf).initialization == expected


def test_valid_finetune_spec_round_trips() -> None:
    raw = spec({**VOLUME_MODEL, "trustRemoteCode": False},
               data={**FILES, "evalPath": "eval.jsonl", "evalEverySteps": 10},
               output={"volumeClaim": "models", "path": "out/ft"})
    assert check_spec(raw) == []
    parsed = MemoryOptimizedTrainingJobSpec.model_validate(raw)
    assert parsed.data is not None and parsed.data.column == "text" and parsed.data.has_eval
    assert MemoryOptimizedTrainingJobSpec.model_validate(parsed.to_wire()) == parsed

"""Fine-tune rules (model source, spec.data, output): each violation with its field path, and the defaults."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from memfit.api.finetune_rules import ESCAPING_PATH, VOLUME_PATHS, escapes, inside_volume
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.problem import HuggingFaceProblem, Initialize
from memfit.api.rules import check_spec

VOLUME_MODEL = {"volumeClaim": "models", "path": "llama-1b"}
FILES = {"files": {"volumeClaim": "data", "path": "train.jsonl"}}


def spec(hf: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    problem = {"huggingface": hf} if hf is not None else {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64,
                                                                      "heads": 4}}
    return {"problem": problem, **sections}


VIOLATIONS: dict[str, tuple[dict[str, Any], str, str]] = {
    "claim without path": (spec({"volumeClaim": "models"}), "spec.problem.huggingface.path", "volumeClaim needs path"),
    "path without claim": (spec({"model": "a/b", "path": "x"}), "spec.problem.huggingface.volumeClaim",
                           "path needs volumeClaim"),
    "no source": (spec({"sequenceLength": 16}), "spec.problem.huggingface.model", "required without volumeClaim"),
    "model path escapes": (spec({**VOLUME_MODEL, "path": "../other"}), "spec.problem.huggingface.path",
                           "path must be a relative path inside the volume: no leading / and no `..` segment"),
    "model path absolute": (spec({**VOLUME_MODEL, "path": "/etc"}), "spec.problem.huggingface.path",
                            "no leading /"),
    "token with volume": (spec({**VOLUME_MODEL, "tokenSecretRef": {"name": "t"}}),
                          "spec.problem.huggingface.tokenSecretRef",
                          "tokenSecretRef is for hub downloads and is refused with volumeClaim"),
    "revision with volume": (spec({**VOLUME_MODEL, "revision": "main"}), "spec.problem.huggingface.revision",
                             "revision is a hub revision and is refused with volumeClaim"),
    "two data sources": (spec(VOLUME_MODEL, data={**FILES, "synthetic": True}), "spec.data",
                         "exactly one of huggingface, files or synthetic: true must be set; got files, synthetic"),
    "no data source": (spec(VOLUME_MODEL, data={"textField": "text"}), "spec.data", "got none"),
    "text and messages": (spec(VOLUME_MODEL, data={**FILES, "textField": "t", "messagesField": "m"}),
                          "spec.data.messagesField", "not both"),
    "evalSplit on files": (spec(VOLUME_MODEL, data={**FILES, "evalSplit": "validation"}), "spec.data.evalSplit",
                           "for files use evalPath"),
    "evalPath on hub": (spec(VOLUME_MODEL, data={"huggingface": {"name": "x/y"}, "evalPath": "e.jsonl"}),
                        "spec.data.evalPath", "for a hub dataset use evalSplit"),
    "evalEvery without eval": (spec(VOLUME_MODEL, data={**FILES, "evalEverySteps": 50}), "spec.data.evalEverySteps",
                               "needs an eval set"),
    "data on builtin": (spec(data=FILES), "spec.data", "need problem.huggingface"),
    "files path escapes": (spec(VOLUME_MODEL, data={"files": {"volumeClaim": "data", "path": "a/../../b"}}),
                           "spec.data.files.path", "path must be a relative path inside the volume"),
    "eval path absolute": (spec(VOLUME_MODEL, data={**FILES, "evalPath": "/data/eval.jsonl"}), "spec.data.evalPath",
                           "evalPath must be a relative path inside the volume"),
    "output escapes": (spec(VOLUME_MODEL, output={"volumeClaim": "out", "path": "a/../../b"}), "spec.output.path",
                       "no `..` segment"),
    "output absolute": (spec(VOLUME_MODEL, output={"volumeClaim": "out", "path": "/etc"}), "spec.output.path",
                        "path must be a relative path inside the volume: no leading /"),
}


@pytest.mark.parametrize(("raw", "path", "words"), VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_violations_name_the_field(raw: dict[str, Any], path: str, words: str) -> None:
    found = check_spec(raw)
    assert any(p == path and words in m for p, m in found), found
    # The model refuses it too: by the cross-field rules, or first by the field's own pattern (absolute).
    with pytest.raises(ValueError, match=re.escape(path.removeprefix("spec."))):
        MemoryOptimizedTrainingJobSpec.model_validate(raw)


ESCAPES: dict[str, tuple[str, bool]] = {
    "parent first": ("../etc", True),
    "parent inside": ("a/../b", True),
    "parent last": ("a/..", True),
    "only parent": ("..", True),
    "absolute": ("/etc/passwd", True),
    "root": ("/", True),
    "dots in a name": ("a..b/c", False),
    "dot folder": ("./models/x", False),
    "hidden folder": (".cache/x", False),
    "name starting with dots": ("..hidden/x", False),
    "plain": ("models/llama-3.2-1b", False),
    "empty (output default)": ("", False),
}


@pytest.mark.parametrize(("path", "leaves"), ESCAPES.values(), ids=ESCAPES.keys())
def test_escapes_refuses_absolute_paths_and_parent_segments(path: str, leaves: bool) -> None:
    assert escapes(path) is leaves
    assert (re.search(ESCAPING_PATH, path) is not None) is leaves  # the regex the CEL rule matches with


def test_every_volume_path_is_checked_with_its_own_name() -> None:
    for field_path in VOLUME_PATHS:
        raw = copy.deepcopy(spec(VOLUME_MODEL, data={**FILES, "evalPath": "e.jsonl"}, output={"volumeClaim": "out"}))
        node = raw
        *parents, leaf = field_path.split(".")[1:]
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = "../x"
        assert check_spec(raw) == [(field_path, inside_volume(field_path))]
        assert inside_volume(field_path).startswith(f"{leaf} must be a relative path inside the volume")


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

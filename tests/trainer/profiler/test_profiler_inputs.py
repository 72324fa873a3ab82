"""Bad profiler input names its field: unknown kind, heads not dividing hidden, zero sizes, bad configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from memfit_trainer.profiler.configs import DEFAULT_CONFIGS, full_grid, parse_configs
from memfit_trainer.profiler.errors import ProfileInputError
from memfit_trainer.profiler.inputs import load_problem, parse_problem

GPT = {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}

BAD_PROBLEMS: dict[str, tuple[Any, str, str]] = {
    "unknown kind": ({"builtin": {**GPT, "kind": "rnn"}}, "problem.builtin.kind", "must be one of"),
    "heads do not divide hidden": ({"builtin": {**GPT, "heads": 5}}, "problem.builtin.heads", "divisible"),
    "zero layers": (
        {"builtin": {**GPT, "layers": 0}},
        "problem.builtin.layers",
        "greater than or equal to 1",
    ),
    "negative hidden": (
        {"builtin": {**GPT, "hidden": -64}},
        "problem.builtin.hidden",
        "greater than or equal",
    ),
    "zero sequence": ({"builtin": {**GPT, "sequenceLength": 0}}, "problem.builtin.sequenceLength", "greater"),
    "patch does not divide image": (
        {"builtin": {**GPT, "kind": "vit", "imageSize": 30, "patchSize": 8}},
        "problem.builtin.patchSize",
        "divisible",
    ),
    "no source": ({}, "problem", "exactly one of builtin, huggingface or entrypoint"),
    "two sources": ({"builtin": GPT, "entrypoint": "a.b:c"}, "problem", "got builtin, entrypoint"),
    "entrypoint syntax": ({"entrypoint": "no-colon"}, "problem.entrypoint", "pattern"),
    "unknown field": ({"builtin": {**GPT, "depth": 3}}, "problem.builtin.depth", "unknown field"),
    "not an object": ([1, 2], "problem", "expected a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_PROBLEMS), ids=list(BAD_PROBLEMS))
def test_bad_problem_names_the_field(case: str) -> None:
    doc, field, words = BAD_PROBLEMS[case]
    with pytest.raises(ProfileInputError) as info:
        parse_problem(doc)
    assert info.value.field == field
    assert words in str(info.value)
    assert str(info.value).startswith(f"{field}: ")


def test_a_manifest_or_spec_problem_is_unwrapped(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "kind: MemoryOptimizedTrainingJob\nspec:\n  problem:\n    builtin: {kind: bert, layers: 1, hidden: 32, heads: 2}\n"
    )
    assert load_problem(path).builtin is not None
    assert load_problem(path).builtin.kind == "bert"  # type: ignore[union-attr]


def test_unreadable_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileInputError) as info:
        load_problem(tmp_path / "missing.json")
    assert info.value.field == "problem"


def test_default_configs_cover_the_calibration_groups() -> None:
    keys = [c.key for c in DEFAULT_CONFIGS]
    assert keys == [
        "fp32:none:1:32bit",
        "fp32:none:2:32bit",
        "bf16:none:1:32bit",
        "bf16:none:2:32bit",
        "bf16:full:1:32bit",
        "bf16:full:2:32bit",
        "bf16:none:1:8bit",
    ]
    assert len(full_grid()) == 16
    assert parse_configs("default") == DEFAULT_CONFIGS


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("fp8:none:1", "precision must be one of fp32, bf16, fp16"),
        ("bf16:some:1", "checkpointing must be one of none, selective, full"),
        ("bf16:none:0", "micro-batch must be a positive integer"),
        ("bf16:none:x", "micro-batch must be a positive integer"),
        ("bf16:none:1:4bit", "8bit or 32bit"),
        ("bf16", "must look like"),
        (",".join(f"fp32:none:{i}" for i in range(1, 18)), "at most 16"),
    ],
)
def test_bad_configs_are_rejected(text: str, words: str) -> None:
    with pytest.raises(ProfileInputError) as info:
        parse_configs(text)
    assert info.value.field == "configs"
    assert words in str(info.value)


def test_configs_parse_and_deduplicate() -> None:
    configs = parse_configs("bf16:full:2:8bit, fp32:selective:4, bf16:full:2:8bit")
    assert [c.key for c in configs] == ["bf16:full:2:8bit", "fp32:selective:4:32bit"]

"""Spec values the CRD admits but Kubernetes refuses in the Job or Pod: each named, before any child."""

from __future__ import annotations

from typing import Any

import pytest
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.kube.child_fields import child_field_problems

PROBLEM = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}}


def spec(**sections: Any) -> MemoryOptimizedTrainingJobSpec:
    return MemoryOptimizedTrainingJobSpec.model_validate({"problem": PROBLEM, **sections})


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "image with a leading space": ({"image": " trainer:1"}, "image:"),
    "image with a newline": ({"image": "trainer\n:1"}, "image:"),
    "priority class in upper case": (
        {"scheduling": {"priorityClassName": "High"}},
        "scheduling.priorityClassName:",
    ),
    "priority class with an underscore": (
        {"scheduling": {"priorityClassName": "high_priority"}},
        "scheduling.priorityClassName:",
    ),
    "claim with an emoji": (
        {"training": {"checkpoint": {"volumeClaim": "ckpt\U0001f680"}}},
        "training.checkpoint.volumeClaim:",
    ),
    "profiling pool in upper case": ({"profiling": {"nodePool": "T4"}}, "profiling.nodePool:"),
}

ACCEPTED: dict[str, dict[str, Any]] = {
    "defaults": {},
    "image with a digest": {"image": "registry.local/memfit/trainer@sha256:" + "a" * 64},
    "kueue queue with dots": {"scheduling": {"kueueQueue": "team-a.gpu-queue"}},
    "priority class with dots": {"scheduling": {"priorityClassName": "ml.high-priority"}},
    "claim": {"training": {"checkpoint": {"volumeClaim": "ckpt-llama"}}},
    "profiling pool": {"profiling": {"nodePool": "l4-ondemand"}},
}


@pytest.mark.parametrize(("sections", "field"), REFUSED.values(), ids=REFUSED.keys())
def test_refused_value_is_named(sections: dict[str, Any], field: str) -> None:
    problems = child_field_problems(spec(**sections))
    assert len(problems) == 1 and problems[0].startswith(field), problems


@pytest.mark.parametrize("sections", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_valid_values_pass(sections: dict[str, Any]) -> None:
    assert child_field_problems(spec(**sections)) == []

"""spec.podTemplate.nodeSelector narrows the pools: a pool whose own selector contradicts a term is not
planned on (no node of it could take the pods), and the plan says why."""

from __future__ import annotations

import copy

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.catalog import CATALOG
from memfit.planner import plan
from planner_factories import make_job, make_pool


def _with_selector(spec: MemoryOptimizedTrainingJobSpec, selector: dict[str, str]) -> MemoryOptimizedTrainingJobSpec:
    raw = copy.deepcopy(spec.to_wire())
    raw["podTemplate"] = {"nodeSelector": selector}
    return MemoryOptimizedTrainingJobSpec.model_validate(raw)


def test_a_pool_whose_selector_contradicts_the_template_is_not_planned_on() -> None:
    cheap = make_pool("cheap", "l4", nodeSelector={"zone": "b"})
    dear = make_pool("dear", "a100-80", nodeSelector={"zone": "a"})
    job = make_job().build()
    assert plan(job, pools=[cheap, dear], catalog=CATALOG).plan.node_pool == "cheap"
    narrowed = plan(_with_selector(job, {"zone": "a"}), pools=[cheap, dear], catalog=CATALOG)
    assert narrowed.plan.node_pool == "dear"
    [rejection] = narrowed.rejections
    assert rejection.pool == "cheap" and "spec.podTemplate.nodeSelector asks zone=a" in rejection.reason
    # A term the pool does not set narrows nodes inside it, not the pool.
    assert plan(_with_selector(job, {"disk": "ssd"}), pools=[cheap, dear], catalog=CATALOG).plan.node_pool == "cheap"

"""First-steps check (memfit_trainer/first_steps.py): a run whose first steps measure more than the plan's
prediction plus headroom saves a checkpoint and stops with MemoryOverPlan; the next attempt resumes there."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.api.plan import Plan
from memfit.api.termination import EXIT_MEMORY_OVER_PLAN
from memfit_trainer.first_steps import FirstStepsCheck
from trainer_support import PlanBuilder, make_plan, run_cli

PREDICTED = 8 * 2**20  # the tiny GPT's CPU peak is ~2.5 MiB: inside, until the factor inflates it


@dataclass(frozen=True)
class Predicted:
    """A plan builder whose plan carries a predicted peak (the builder's plans predict 0: check off)."""

    builder: PlanBuilder
    peak_bytes: int = PREDICTED

    def wire(self) -> dict[str, Any]:
        wire = self.builder.wire()
        wire["memory"]["peakBytes"] = self.peak_bytes
        return wire

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.wire()), encoding="utf-8")
        return path


def test_budget_is_prediction_plus_headroom_and_off_without_a_prediction() -> None:
    plan = Plan.model_validate(Predicted(make_plan()).wire())
    check = FirstStepsCheck.for_plan(plan, environ={})
    assert check is not None and check.steps == 3
    assert check.budget_bytes == int(PREDICTED * 1.10)
    assert check.verdict(2, check.budget_bytes) is None
    over = check.verdict(2, check.budget_bytes + 1)
    assert over is not None and over.step == 2 and "exceeds the plan's prediction 0.01 GiB" in str(over)
    assert FirstStepsCheck.for_plan(plan, environ={"MEMFIT_FIRST_STEPS": "0"}) is None
    assert FirstStepsCheck.for_plan(make_plan().build(), environ={}) is None  # peakBytes 0: nothing to check
    assert check.checks(3, start_step=0) and not check.checks(4, start_step=0) and check.checks(5, start_step=2)


def test_over_the_plan_stops_after_a_checkpoint_and_the_next_attempt_resumes(tmp_path: Path) -> None:
    plan = Predicted(make_plan().steps(6, every=1000).checkpoint_dir(tmp_path / "ckpt"))
    within = run_cli(Predicted(make_plan().steps(2)), tmp_path)  # the same plan without injection passes
    assert within.returncode == 0, within.output[-3000:]
    (report,) = within.reports.values()
    assert 0 < report["first_steps_peak_bytes"] <= PREDICTED

    stopped = run_cli(plan, tmp_path, env={"MEMFIT_INJECT_PEAK_FACTOR": "10"})
    assert stopped.returncode == EXIT_MEMORY_OVER_PLAN, stopped.output[-3000:]
    message = stopped.termination
    assert message is not None and message["reason"] == "MemoryOverPlan"
    assert message["step"] == 1 and message["budgetBytes"] == int(PREDICTED * 1.1)
    assert message["peakBytes"] > message["budgetBytes"]
    assert message["memoryMeter"] == "cpu-allocator-profiler"
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000001"]

    resumed = run_cli(plan, tmp_path)  # the re-planned attempt (here: the same plan, no injection)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert resumed.termination is not None and resumed.termination["resumedFromStep"] == 1
    assert resumed.termination["steps"] == 6

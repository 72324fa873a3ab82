"""The own-code accuracy benchmark (benchmarks/own_code_accuracy.py) without running a script: its cases,
the `spec.problem` each script is planned with, the signed errors and the sections it reports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmark imports benchmarks/provenance.py
    spec = importlib.util.spec_from_file_location("benchmark_own_code_accuracy",
                                                  REPO / "benchmarks" / "own_code_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _bench()
CASES = bench.all_cases()


def test_cases_are_unique_cover_both_scripts_and_splits_and_share_probe_runs() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.script for c in CASES} == set(bench.SCRIPTS) and all(p.exists() for p in bench.SCRIPTS.values())
    assert {c.model.split for c in CASES} == {"dev", "held_out"}
    runs = {c.run_key for c in CASES}
    assert len(runs) < len(CASES)  # micro-batches of one setting share one probe run (its ladder)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_case_is_predicted_from_the_problem_a_user_writes(case: object) -> None:
    from memfit.api.problem import Problem

    Problem.model_validate(bench.problem_of(case))  # a valid spec.problem
    predicted = bench.predict(case, None)
    assert predicted["bytes"] > 0
    assert predicted["bytes"] >= predicted["parameters_bytes"] + predicted["optimizer_bytes"]


def test_the_model_flags_reach_the_problem_and_the_command() -> None:
    case = next(c for c in CASES if c.script == "hf-trainer" and c.model.split == "held_out")
    config = bench.problem_of(case)["huggingface"]["config"]
    m = case.model
    assert (config["n_layer"], config["n_embd"], config["n_head"], config["vocab_size"], config["n_positions"]) == (
        m.layers, m.hidden, m.heads, m.vocab, m.seq)
    args = m.args()
    assert args[args.index("--hidden") + 1] == str(m.hidden) and args[args.index("--seq-len") + 1] == str(m.seq)


def test_errors_are_signed_and_sections_name_the_worst_under_prediction() -> None:
    assert bench.error_pct(100, 90) == pytest.approx(-10.0)
    rows = [{"error_pct": -6.0}, {"error_pct": 2.0}, {"error_pct": None}, {"error_pct": 4.0}]
    assert bench.section(rows) == {"cases": 3, "mape": 4.0, "max_under_pct": 6.0, "median_error_pct": 2.0}
    assert bench.section([{"error_pct": 3.0}])["max_under_pct"] == 0.0
    assert bench.section([])["mape"] is None


def test_a_report_without_profiles_or_truth_still_names_every_case() -> None:
    cases = CASES[:3]
    truth = {cases[0].id: {"truth_bytes": 2 * bench.predict(cases[0], None)["bytes"]}}
    report = bench.build_report(cases, truth, {}, {})
    assert [r["id"] for r in report["cases"]] == [c.id for c in cases]
    assert report["cases"][0]["probed"] is None and "probed_error_pct" not in report["cases"][0]
    assert report["cases"][0]["error_pct"] == pytest.approx(-50.0, abs=0.01)
    assert "error_pct" not in report["cases"][1]
    assert report["sections"]["all"]["cases"] == 1


def test_the_probe_runs_the_operators_configuration_and_its_ratio_scales_the_prediction() -> None:
    """The probed runs are the profiling pod's (memfit.lifecycle.probe_points on a CPU: bf16, no checkpointing,
    micro-batches 1 and 2), and a script measured at 1.25x the prediction scales its family by 1.25x and
    every other case by at least that (planner.measured)."""
    from memfit.api.job import MemoryOptimizedTrainingJobSpec
    from memfit.api.problem import Problem
    from memfit.api.profile import Profile
    from memfit.lifecycle.probe_points import PROBE_MICRO_BATCHES, probe_config
    from memfit.memory.problems import shape_from_problem
    from memfit_testbed.own_code_cases import LOOP, job_spec

    config = probe_config(MemoryOptimizedTrainingJobSpec.model_validate(job_spec(LOOP)), None)
    assert (config.precision.value, config.activation_checkpointing.value, PROBE_MICRO_BATCHES) == bench.PROBED
    case = next(c for c in CASES if c.script == "plain-loop" and c.precision == "bf16" and c.micro_batch == 8)
    probes = bench.probe_cases([case])
    assert [(p.precision, p.checkpointing, p.micro_batch) for p in probes] == [("bf16", "none", 1), ("bf16", "none", 2)]
    shape = shape_from_problem(Problem.model_validate(bench.problem_of(case)))
    profile = Profile(problem_hash="x", shape=shape)
    unscaled = {p.id: bench.predict(p, profile)["bytes"] for p in probes}
    points = {pid: {"truth_bytes": int(1.25 * b)} for pid, b in unscaled.items()}
    probed = bench.probed_predict(case, profile, points)
    assert probed is not None and probed["factor"] == pytest.approx(1.25, abs=1e-3)
    assert probed["bytes"] == pytest.approx(1.25 * bench.predict(case, profile)["bytes"], rel=1e-3)
    fp32 = next(c for c in CASES if c.script == "plain-loop" and c.precision == "fp32" and c.model == case.model)
    other = bench.probed_predict(fp32, profile, points)
    assert other is not None and other["factor"] >= 1.25

"""benchmarks/memory_accuracy.py --quick: the report's shape, the truth, and memfit's accuracy bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from profiler_support import REPO, TORCH_EXTENSIONS_DIR

pytest.importorskip("torch")
# The committed benchmarks/results/memory_accuracy_quick.json is this run, redone whenever what it measures
# changes (tests/unit/test_benchmark_results.py): `make test` leaves the rerun here out (docs/testing.md).
pytestmark = pytest.mark.extended

# Issue 9's targets (MAPE <= 3 %, worst under-prediction <= 5 %), held on the quick cases too: memfit
# measured 0.51 % MAPE and 0.28 % worst under-prediction on them (benchmarks/results/
# memory_accuracy_quick.json; 0.78 % / 3.88 % on the full 49 cases).
MEMFIT_QUICK_MAPE_BOUND = 3.0
MEMFIT_QUICK_MAX_UNDER_BOUND = 5.0
PREDICTORS = {"memfit", "memfit-analytic", "deepspeed", "accelerate", "memtracker"}
SUMMARY_KEYS = {"mape", "p95_abs_pct", "max_under_pct", "coverage", "seconds_per_prediction"}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("accuracy") / "quick.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "memory_accuracy.py"), "--quick", "--json", str(out)],
        env={**os.environ, "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "memfit vs peer" in proc.stdout
    return json.loads(out.read_text())


def test_report_shape(report: dict[str, object]) -> None:
    predictors = report["predictors"]
    assert isinstance(predictors, dict) and set(predictors) == PREDICTORS
    for summary in predictors.values():
        assert set(summary) == SUMMARY_KEYS
    cases = report["cases"]
    assert isinstance(cases, list) and 1 <= len(cases) <= 12
    for case in cases:
        assert {"id", "config", "truth_bytes", "predictions"} <= set(case)
        assert case["truth_bytes"] > 0, case
        assert set(case["predictions"]) == PREDICTORS
    assert predictors["memfit"]["coverage"] == len(cases)
    # Peers need a builtin model: the entrypoint (CNN) cases are memfit's alone.
    transformer = [c for c in cases if c["config"]["family"] == "gpt-quick"]
    assert 1 <= len(transformer) < len(cases)
    assert predictors["memtracker"]["coverage"] == len(transformer)
    assert predictors["deepspeed"]["coverage"] == 0  # no DeepSpeed case in --quick
    adam32 = [c for c in transformer if c["config"]["optimizer"] == "adamw" and not c["config"]["eight_bit"]]
    assert predictors["accelerate"]["coverage"] == len(adam32)


def test_truth_matches_the_profile_of_the_same_configuration(report: dict[str, object]) -> None:
    # The profiler (elided DDP steps) and the truth worker (real DdpRunner steps) measure the same
    # allocator counter: at a configuration both ran, they agree to within a few KB.
    profile = report["profiles"]["gpt-quick:adamw"]["profile"]
    measured = {
        (m["precision"], m["checkpointing"], m["microBatchSize"], m.get("optimizer8bit", False)): m[
            "peakAllocatedBytes"
        ]
        for m in profile["measurements"]
    }
    shared = 0
    for case in report["cases"]:
        c = case["config"]
        if c["family"] != "gpt-quick":
            continue
        key = (c["precision"], c["checkpointing"], c["micro_batch_size"], c["eight_bit"])
        if c["optimizer"] == "adamw" and key in measured:
            shared += 1
            assert abs(measured[key] - case["truth_bytes"]) <= max(8192, 0.001 * case["truth_bytes"]), case[
                "id"
            ]
    assert shared >= 2


def test_memfit_quick_mape_is_within_the_stated_bound(report: dict[str, object]) -> None:
    memfit = report["predictors"]["memfit"]
    assert memfit["mape"] <= MEMFIT_QUICK_MAPE_BOUND, memfit
    assert memfit["max_under_pct"] <= MEMFIT_QUICK_MAX_UNDER_BOUND, memfit
    # memfit predicts a new configuration by arithmetic: far below a millisecond.
    assert memfit["seconds_per_prediction"] < 1e-3


def test_each_section_holds_the_bounds(report: dict[str, object]) -> None:
    # Issue 14: the entrypoint section (a CNN with BatchNorm, activations measured) and the transformer
    # section each hold 3 % MAPE and 5 % worst under-prediction.
    sections = report["sections"]
    assert {"transformer", "entrypoint"} <= set(sections)
    for name in ("transformer", "entrypoint"):
        assert sections[name]["mape"] <= MEMFIT_QUICK_MAPE_BOUND, (name, sections[name])
        assert sections[name]["max_under_pct"] <= MEMFIT_QUICK_MAX_UNDER_BOUND, (name, sections[name])

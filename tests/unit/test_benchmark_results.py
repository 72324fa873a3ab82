"""Committed benchmark results measure the code at hand: each names its commit and measured sources,
and fails here when those sources changed after it was produced without a rerun."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def _provenance() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmark_provenance", REPO / "benchmarks" / "provenance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


provenance = _provenance()
pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                                reason="needs the git checkout")
RESULT_FILES = sorted(RESULTS.glob("*.json"))


def test_there_are_results_to_check() -> None:
    assert {"planner.json", "memory_accuracy.json", "reliability.json", "scale.json"} <= {p.name for p in RESULT_FILES}


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.name for p in RESULT_FILES])
def test_result_is_fresh(path: Path) -> None:
    result = json.loads(path.read_text(encoding="utf-8"))
    reason = provenance.stale_reason(result)
    assert reason is None, f"benchmarks/results/{path.name}: {reason}"


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.name for p in RESULT_FILES])
def test_result_commit_is_in_history(path: Path) -> None:
    commit = json.loads(path.read_text(encoding="utf-8")).get("provenance", {}).get("commit")
    assert commit, f"{path.name} names no commit"
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip() == "true"
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO).returncode == 0
    assert known or shallow, f"{path.name} names commit {commit}, which this repository does not have"


def test_a_change_to_a_measured_file_makes_the_result_stale(tmp_path: Path) -> None:
    measures = ["benchmarks/provenance.py"]
    result = {"provenance": provenance.stamp(measures, command="python benchmarks/provenance.py")}
    assert provenance.stale_reason(result) is None
    edited = dict(result["provenance"], sources_sha256="0" * 64)
    reason = provenance.stale_reason({"provenance": edited})
    assert reason is not None and "rerun `python benchmarks/provenance.py`" in reason


def test_a_result_without_provenance_is_stale() -> None:
    assert "no provenance" in (provenance.stale_reason({"figures": 1}) or "")
    gone = {"commit": "0" * 40, "measures": ["no/such/path"], "sources_sha256": "x", "command": "c"}
    assert provenance.stale_reason({"provenance": gone}) is not None

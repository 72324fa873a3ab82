"""`memfit validate` and `memfit catalog` as a user runs them."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from memfit.cli.cluster import quiet_garbage_collector

REPO = Path(__file__).resolve().parents[2]

BAD = """\
apiVersion: memfit.dev/v1alpha1
kind: MemoryOptimizedTrainingJob
metadata: {name: bad}
spec:
  problem:
    builtin: {kind: gpt2, layers: -1, hidden: 64, heads: 4}
  strategy: {zeroStage: 7, bogus: 1}
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memfit.cli", *args], capture_output=True, text=True, cwd=REPO
    )


def test_validate_examples_exit_0() -> None:
    result = run("validate", *sorted(str(p) for p in (REPO / "examples").glob("*.yaml")))
    assert result.returncode == 0, result.stderr
    assert "ok: " in result.stdout


def test_validate_bad_file_exits_2_with_every_violation_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    result = run("validate", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    for path in (
        "spec.problem.builtin.kind",
        "spec.problem.builtin.layers",
        "spec.strategy.zeroStage",
        "spec.strategy.bogus",
    ):
        assert path in result.stderr, result.stderr
    assert "unknown field" in result.stderr


def test_validate_not_yaml_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    result = run("validate", str(bad), str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "not valid YAML" in result.stderr and "cannot read" in result.stderr
    assert "Traceback" not in result.stderr


def test_catalog_lists_required_gpus() -> None:
    result = run("catalog")
    assert result.returncode == 0
    for key in ("t4", "l4", "a10g", "l40s", "a100-40", "a100-80", "h100-80", "h200"):
        assert f"\n{key} " in "\n" + result.stdout


def test_help_lists_every_command_and_nothing_that_does_not_exist() -> None:
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert "{crds,validate,catalog,plan,estimate,operator,pools,kueue}" in result.stdout
    assert "demo" not in result.stdout  # the quickstart is `make demo`, not a memfit command


def test_the_operator_keeps_start_up_objects_out_of_the_collectors_scans() -> None:
    threshold = gc.get_threshold()
    try:
        quiet_garbage_collector()
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] > threshold[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)

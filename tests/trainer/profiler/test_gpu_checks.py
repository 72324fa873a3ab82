"""benchmarks/gpu_checks.py: skips cleanly without CUDA; on a GPU, its quick run reports T1/T2/T3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from profiler_support import REPO, TORCH_EXTENSIONS_DIR

torch = pytest.importorskip("torch")
SCRIPT = REPO / "benchmarks" / "gpu_checks.py"


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), *extra],
        env={**os.environ, "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR},
        capture_output=True,
        text=True,
        timeout=1200,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_skips_cleanly_without_cuda(tmp_path: Path) -> None:
    proc = _run(tmp_path / "gpu.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gpu_checks: skipped: ")
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.gpu
def test_quick_gpu_run_reports_cuda_truths(tmp_path: Path) -> None:
    proc = _run(tmp_path / "gpu.json", "--quick")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    for case in report["cases"]:
        assert case["t1_allocated_bytes"] > 0
        assert case["t2_reserved_bytes"] >= case["t1_allocated_bytes"]
    assert report["predictors"]["memfit"]["coverage"] == len(report["cases"])

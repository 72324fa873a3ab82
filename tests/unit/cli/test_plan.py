"""`memfit plan` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from memfit.api.plan import Plan
from memfit.cli import main

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"
QUICKSTART = str(REPO / "examples" / "quickstart.yaml")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memfit.cli", *args], capture_output=True, text=True, cwd=REPO)


def test_plan_quickstart_offline_prints_plan_alternatives_and_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", QUICKSTART]) == 0
    out = capsys.readouterr().out
    for text in ("memfit plan: quickstart", "Plan (predicted):", "Alternatives (best on each other pool):",
                 # The practitioner: the cheapest catalog GPU per GPU-hour holding 20 B/param, a T4 (no bf16).
                 "peak per GPU", "Baseline: plain fp16 DDP on 1x8 Tesla-T4 (t4)",
                 "Baseline: declared: plain bf16 DDP on 1x8 NVIDIA-A100-SXM4-80GB (a100-80)",
                 "memfit vs this baseline: saves "):
        assert text in out


def test_plan_says_why_it_costs_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(REPO / "examples" / "llama-finetune.yaml"), "--pools",
                 str(REPO / "examples" / "gpunodepools.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Why this cost:\n  - interruptions priced as risk: $" in out
    assert "0.05 interruptions per node-hour (spot), checkpoints every 200 steps" in out


def test_plan_json_is_the_plan_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", QUICKSTART, "--json"]) == 0
    plan = Plan.model_validate(json.loads(capsys.readouterr().out))
    assert plan.training is not None and plan.training.global_batch_size == 8
    assert plan.memory.peak_bytes * 1.1 <= plan.gpu_memory_bytes


def test_plan_chart_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path / "plan.png"
    assert main(["plan", QUICKSTART, "--chart", str(chart)]) == 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"Chart: {chart}" in capsys.readouterr().out


def test_no_fit_exits_1_with_a_reason_per_pool() -> None:
    result = run("plan", str(FIXTURES / "llama-7b-small-pools.yaml"), "--pools", str(FIXTURES / "small-pools.yaml"))
    assert result.returncode == 1, result.stderr
    assert "NoFit: nothing fits." in result.stdout
    assert "nofit: l4-spot: without offload it needs" in result.stderr
    assert "nofit: t4-spot: " in result.stderr
    assert "Traceback" not in result.stderr


def test_impossible_pins_exit_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(FIXTURES / "pinned-ddp-zero3.yaml")]) == 1
    assert "nofit: the pinned strategy cannot run: DDP does not shard" in capsys.readouterr().err


def test_bf16_and_nvme_pinned_on_t4_spot_without_nvme_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(FIXTURES / "pinned-bf16-nvme.yaml"), "--pools", str(FIXTURES / "small-pools.yaml")]) == 1
    err = capsys.readouterr().err
    assert "nofit: t4-spot: " in err and "Tesla-T4 has no bf16" in err
    assert "NVMe offload needs local NVMe; the pool has none" in err


def test_invalid_job_exits_2_with_field_paths_and_no_traceback() -> None:
    result = run("plan", str(FIXTURES / "bad-job.yaml"))
    assert result.returncode == 2
    assert "spec.problem.builtin.layers" in result.stderr and "spec.training.maxStepz" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(FIXTURES / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_bad_pools_become_reasons_and_the_good_pool_is_planned(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", QUICKSTART, "--pools", str(FIXTURES / "bad-pools.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  1  l4 " in out
    assert "- negative: invalid (" in out and "spec.pricePerNodeHour: Input should be greater than or equal to 0" in out
    assert "- no-memory: gpu.memoryMiB is 0" in out


def test_plan_with_a_profile_uses_its_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", QUICKSTART, "--profile", str(FIXTURES / "gpt-profile.json")]) == 0
    assert "shape from the profile" in capsys.readouterr().out

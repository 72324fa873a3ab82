"""CUDA-only checks: fp16 loss scaling, NVMe offload with async I/O, CUDA memory truth.

Skipped without a GPU. When they run, the facts go to benchmarks/results/trainer_gpu.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainer_support import REPO, PlanBuilder, losses, make_plan, run_cli

pytestmark = pytest.mark.gpu
RESULTS = REPO / "benchmarks" / "results" / "trainer_gpu.json"


def _record(case: str, run: Any) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    report = run.reports.get(0, {})
    results[case] = {
        "termination": run.termination,
        "losses": report.get("losses"),
        "facts": report.get("facts"),
        "step_memory": report.get("step_memory"),
    }
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True))


@pytest.mark.parametrize(
    "plan",
    [
        make_plan().deepspeed(2).precision("fp16"),
        make_plan().ddp().precision("fp16"),
        make_plan().fsdp(3).precision("fp16"),
    ],
    ids=["zero2-fp16", "ddp-fp16", "fsdp3-fp16"],
)
def test_fp16_with_loss_scaling_on_gpu(plan: PlanBuilder, tmp_path: Path) -> None:
    run = run_cli(plan.steps(8), tmp_path)
    _record(f"fp16 {plan.wire()['engine']}", run)
    assert run.returncode == 0, run.output[-3000:]
    report = run.reports[0]
    assert losses(report)[-1] < losses(report)[0]
    facts = report["facts"]
    assert facts.get("fp16") is True or facts.get("grad_scaler") is True
    assert run.termination is not None and run.termination["memoryMeter"] == "cuda-allocator"
    assert run.termination["peakBytes"] > 0 and run.termination["capacityBytes"] > 0


def test_nvme_offload_with_async_io(tmp_path: Path) -> None:
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    run = run_cli(make_plan().deepspeed(3).bf16().offload("nvme", str(nvme)).steps(4), tmp_path)
    _record("zero3 nvme offload", run)
    assert run.returncode == 0, run.output[-3000:]
    facts = run.reports[0]["facts"]
    assert facts["offload_optimizer"] == "nvme" and facts["offload_param"] == "nvme"
    assert any(nvme.rglob("*")), "DeepSpeed wrote no swap files under the NVMe path"


def test_cuda_oom_is_reported_with_the_real_peak(tmp_path: Path) -> None:
    import torch

    free_bytes, _ = torch.cuda.mem_get_info()
    # A micro-batch whose logits alone exceed the free GPU memory.
    vocab = 65536
    sequence = 4096
    micro = max(1, int(free_bytes // (sequence * vocab * 4)) + 1)
    plan = (
        make_plan().ddp().batch(micro, 1)
        .problem({"builtin": {"kind": "gpt", "layers": 1, "hidden": 64, "heads": 4, "vocab": vocab, "sequenceLength": sequence}})
        .steps(2)
    )  # fmt: skip
    run = run_cli(plan, tmp_path)
    _record("real cuda oom", run)
    assert run.returncode == 87, run.output[-3000:]
    assert run.termination is not None and run.termination["reason"] == "CUDAOutOfMemory"
    assert run.termination["requestedBytes"] > 0

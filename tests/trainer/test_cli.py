"""`memfit-trainer` as the pod runs it: exit codes and termination messages for OOM and bad plans."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

import pytest
from memfit_trainer import cli
from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config
from trainer_support import TINY_GPT, make_plan, run_cli

HERE = Path(__file__).resolve().parent


def test_injected_oom_writes_the_message_and_exits_87(tmp_path: Path) -> None:
    run = run_cli(make_plan().deepspeed(2).steps(5), tmp_path, env={"MEMFIT_INJECT_OOM_AT_STEP": "3"})
    assert run.returncode == 87, run.output[-3000:]
    message = run.termination
    assert message is not None
    assert message["reason"] == "CUDAOutOfMemory"
    assert message["step"] == 3 and message["rank"] == 0
    assert message["peakBytes"] > 0
    assert message["memoryMeter"] == "cpu-allocator-profiler"
    assert "MEMFIT_INJECT_OOM_AT_STEP=3" in message["message"]
    assert "step 3/5" not in run.output  # the step never completed


@pytest.mark.slow
def test_completed_two_rank_run_reports_every_rank_peak_its_device_and_step_time(tmp_path: Path) -> None:
    """What the operator learns from: the allocator peak of each rank (largest = peakBytes), where it was
    measured, and the mean step time after the first step."""
    run = run_cli(make_plan().ddp().world(2).steps(3), tmp_path)
    assert run.returncode == 0, run.output[-3000:]
    message = run.termination
    assert message is not None and message["reason"] == "Completed"
    assert len(message["rankPeaks"]) == 2 and all(p > 0 for p in message["rankPeaks"])
    assert message["peakBytes"] == max(message["rankPeaks"])
    assert message["device"] == "cpu" and "reservedPeakBytes" not in message  # no caching allocator on CPU
    assert message["stepSeconds"] > 0
    # The whole job's rate at the slowest rank's pace: 2 ranks x (micro-batch 2 x 2 accumulation) samples
    # of the tiny GPT's sequence per step (what status.progress shows when no read caught the run).
    tokens_per_step = 2 * 2 * 2 * TINY_GPT["sequenceLength"]
    assert message["tokensPerSecond"] == pytest.approx(tokens_per_step / message["stepSeconds"], rel=1e-3)


def test_simulated_gpu_meter_adds_a_reservation_and_context_to_real_allocator_bytes(tmp_path: Path) -> None:
    env = {"MEMFIT_SIMULATED_GPU": '{"fragmentation": 1.05, "contextMiB": 300}'}
    run = run_cli(make_plan().ddp().steps(2), tmp_path, env=env)
    assert run.returncode == 0, run.output[-3000:]
    message = run.termination
    assert message is not None and message["memoryMeter"] == "simulated-gpu"
    assert message["device"] == "simulated-cuda"
    assert message["reservedPeakBytes"] == int(message["peakBytes"] * 1.05)
    assert message["devicePeakBytes"] == message["reservedPeakBytes"] + 300 * 2**20


def test_malformed_simulated_gpu_is_an_error_naming_the_variable(tmp_path: Path) -> None:
    run = run_cli(make_plan().ddp().steps(1), tmp_path, env={"MEMFIT_SIMULATED_GPU": "fast"})
    assert run.returncode != 0 and "MEMFIT_SIMULATED_GPU must be JSON" in run.output


def test_oom_on_one_rank_of_two_fails_the_pod_with_87(tmp_path: Path) -> None:
    """Through the launcher: torchrun exits 1, memfit-trainer maps the workers' message back to 87."""
    env = {"MEMFIT_INJECT_OOM_AT_STEP": "2", "MEMFIT_INJECT_OOM_RANK": "1"}
    run = run_cli(make_plan().fsdp(3).world(2).steps(4), tmp_path, env=env)
    assert run.returncode == 87, run.output[-3000:]
    assert run.termination is not None
    assert (run.termination["reason"], run.termination["rank"], run.termination["step"]) == (
        "CUDAOutOfMemory",
        1,
        2,
    )


def test_host_ram_exhaustion_in_an_entrypoint_problem_exits_87(tmp_path: Path) -> None:
    plan = make_plan().ddp().problem({"entrypoint": "oom_problem:problem"}).steps(4)
    run = run_cli(plan, tmp_path, env={"PYTHONPATH": str(HERE)})
    assert run.returncode == 87, run.output[-3000:]
    assert run.termination is not None
    assert (run.termination["reason"], run.termination["step"]) == ("HostOutOfMemory", 2)


def _plan_with(tmp_path: Path, **changes: object) -> dict[str, object]:
    wire = make_plan().wire() | changes
    return wire


INVALID = {
    "unknown engine": ({"engine": "megatron"}, {}, "engine"),
    "zero-3 with ddp": ({"engine": "ddp", "zeroStage": 3}, {}, "ZeRO-3 with DDP"),
    "nvme offload without a path": (
        {"engine": "deepspeed", "zeroStage": 3, "offload": "nvme"},
        {},
        "nvmePath",
    ),
    "world size mismatch": (
        {"gpusPerNode": 2},
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"},
        "world size 1",
    ),
    "problem cannot be imported": ({"problem": {"entrypoint": "no_such_module:make"}}, {}, "no_such_module"),
}


@pytest.mark.parametrize("name", INVALID)
def test_invalid_plan_is_refused_before_training(name: str, tmp_path: Path) -> None:
    changes, env, fragment = INVALID[name]
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(_plan_with(tmp_path, **changes)))
    import subprocess

    from trainer_support import PYTHON, REPO, subprocess_env

    started = time.monotonic()
    proc = subprocess.run(
        [PYTHON, "-m", "memfit_trainer.cli", "train", "--plan", str(plan_path), "--report-dir", str(tmp_path / "r")],
        env=subprocess_env(tmp_path, **env), cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 88, proc.stderr[-3000:]
    message = json.loads((tmp_path / "termination-log").read_text())
    assert message["reason"] == "InvalidPlan"
    assert fragment in message["message"]
    assert "step 1/" not in proc.stderr and not (tmp_path / "r").exists()
    assert time.monotonic() - started < 60


def test_missing_plan_file_is_an_invalid_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFIT_TERMINATION_MESSAGE_PATH", str(tmp_path / "termination-log"))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["train", "--plan", str(tmp_path / "absent.json")]) == 88
    message = json.loads((tmp_path / "termination-log").read_text())
    assert message["reason"] == "InvalidPlan" and "cannot read plan" in message["message"]


def test_profile_subcommand_delegates_to_the_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("memfit_trainer.profiler.cli")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "memfit_trainer.profiler.cli", fake)
    assert cli.main(["profile", "--problem", "p.json", "--out", "o.json"]) == 0
    assert seen == [["--problem", "p.json", "--out", "o.json"]]


def test_deepspeed_config_subcommand_prints_the_derived_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = make_plan().deepspeed(3).bf16().offload("cpu")
    assert cli.main(["deepspeed-config", "--plan", str(plan.write(tmp_path / "plan.json"))]) == 0
    assert json.loads(capsys.readouterr().out) == build_deepspeed_config(plan.build(), cuda=True)

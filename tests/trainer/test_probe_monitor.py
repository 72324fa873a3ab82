"""A training pod's own command under the probe (memfit_trainer.probe.monitor), from the bundle in a Python
that has torch and nothing else of memfit's: the progress the operator reads, the first-steps check that
stops a script before an out-of-memory with MemoryOverPlan, and the script's own end passed through."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from memfit.api.termination import EXIT_MEMORY_OVER_PLAN
from memfit.controller.trainer_metrics import parse_trainer_metrics
from memfit.lifecycle.progress import trainer_sample
from probe_support import PROBE_LOOP
from test_probe_bundle import bundle_env
from trainer_support import PYTHON

JOB = "own-job"
GIB = 2**30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def monitored(tmp: Path, script_args: list[str], *, predicted: int = 8 * GIB, headroom: int = 10,
              env: dict[str, str] | None = None, port: int = 0, torchrun: int = 0) -> subprocess.Popen[str]:
    """The monitor from the bundle over probe_loop, with a Plan predicting `predicted` bytes."""
    bundle, run_env = bundle_env(tmp)
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"memory": {"peakBytes": predicted}, "headroomPercent": headroom}))
    run_env |= {"MEMFIT_PLAN_PATH": str(plan), "MEMFIT_JOB": JOB, **(env or {})}
    run_env["PYTHONPATH"] = str(tmp / "blocked")  # the image's own; the launcher finds its folder itself
    command = [PYTHON, str(PROBE_LOOP), *script_args]
    if torchrun:
        command = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun}", *command[1:]]
    return subprocess.Popen(
        [PYTHON, str(bundle / "memfit_probe.py"), "monitor", "--metrics-port", str(port),
         "--termination-log", str(tmp / "termination-log"), "--", *command],
        env=run_env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def termination(tmp: Path) -> dict[str, object]:
    log = tmp / "termination-log"
    return json.loads(log.read_text()) if log.exists() else {}


def read_progress(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return parse_trainer_metrics(response.read().decode(), job=JOB)
    except OSError:
        return None


def test_the_operator_reads_a_running_scripts_progress_and_learns_its_peaks_at_the_end(tmp_path: Path) -> None:
    port, gate = free_port(), tmp_path / "gate"
    proc = monitored(tmp_path, ["--steps", "5", "--micro-batch", "2", "--gate", str(gate), "--gate-after", "3",
                                "--report-loss"], port=port)
    try:
        values = None
        deadline = time.monotonic() + 120
        # The script waits at the gate after its third step; the third step's reading comes with the next
        # step's first module call, so two steps are read by then.
        while time.monotonic() < deadline and proc.poll() is None:
            values = read_progress(port)
            if values and values["memfit_trainer_step"] >= 2:
                break
            time.sleep(0.2)
        assert values is not None, proc.stderr.read() if proc.poll() is not None else "no progress served"
        sample = trainer_sample(values, attempt=1, pod="p")
        assert sample is not None and sample.step == 2 and sample.step_count == 2
        assert sample.step_seconds_sum > 0 and sample.loss is not None and sample.loss > 0  # report_loss
    finally:
        gate.touch()
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    message = termination(tmp_path)
    assert message["reason"] == "Completed" and message["steps"] == 5
    assert message["memoryMeter"] == "cpu-allocator-profiler" and message["device"] == "cpu"
    assert message["peakBytes"] == max(message["rankPeaks"]) > 0 and message["stepSeconds"] > 0
    assert message["finalLoss"] > 0


def test_without_a_reported_loss_none_is_served(tmp_path: Path) -> None:
    from memfit_trainer.probe.monitor import exposition
    from memfit_trainer.probe.records import RUNNING, ProbeResult

    result = ProbeResult(rank=0, device="cpu", memory_meter="cpu-allocator-profiler", steps_wanted=3, ended=RUNNING,
                         forward_calls=4, steps_read=4, step_seconds_sum=2.0)  # fmt: skip
    values = parse_trainer_metrics(exposition(result, job=JOB), job=JOB)
    assert values is not None and "memfit_trainer_loss" not in values
    sample = trainer_sample(values, attempt=1)
    assert sample is not None and (sample.step, sample.loss, sample.step_seconds_sum) == (4, None, 2.0)
    assert parse_trainer_metrics(exposition(result, job=JOB), job="another-job") is None


def test_a_first_step_over_the_plan_stops_the_script_with_memory_over_plan(tmp_path: Path) -> None:
    proc = monitored(tmp_path, ["--steps", "50", "--micro-batch", "2"], predicted=4096, headroom=10)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_MEMORY_OVER_PLAN, stderr
    message = termination(tmp_path)
    assert message["reason"] == "MemoryOverPlan" and message["step"] == 1
    assert message["budgetBytes"] == int(4096 * 1.1) < message["peakBytes"]
    assert "stopping before an out-of-memory to re-plan" in stderr


def test_the_injected_factor_trips_the_check_on_every_rank_of_torchrun_and_0_first_steps_turn_it_off(
        tmp_path: Path) -> None:  # fmt: skip
    injected = {"MEMFIT_INJECT_PEAK_FACTOR": "100000"}
    proc = monitored(tmp_path / "on", ["--steps", "50", "--micro-batch", "2"], env=injected, torchrun=2)
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_MEMORY_OVER_PLAN, stderr  # torchrun itself exits 1: the monitor reads the ranks
    message = termination(tmp_path / "on")
    assert message["reason"] == "MemoryOverPlan" and len(message["rankPeaks"]) in (1, 2)
    # The injected measurement is what the operator learns (as memfit's trainer reports it): over the plan.
    assert message["peakBytes"] > message["budgetBytes"] == int(8 * GIB * 1.1)
    assert message["peakBytes"] > 1000 * max(message["rankPeaks"])  # the raw peaks beside it

    proc = monitored(tmp_path / "off", ["--steps", "3", "--micro-batch", "2"],
                     env={**injected, "MEMFIT_FIRST_STEPS": "0"})
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert termination(tmp_path / "off")["reason"] == "Completed"


def test_a_script_that_fails_keeps_its_exit_code_and_leaves_the_log_as_its_message(tmp_path: Path) -> None:
    proc = monitored(tmp_path, ["--mode", "exits", "--micro-batch", "2"])
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "giving up after step 1 on purpose" in stderr
    assert not (tmp_path / "termination-log").exists()


def test_a_scripts_own_json_termination_message_keeps_its_keys_beside_memfits(tmp_path: Path) -> None:
    from memfit.api.termination import TerminationMessage, TerminationReason
    from memfit_trainer.probe.monitor import write_termination

    done = TerminationMessage(reason=TerminationReason.COMPLETED, peak_bytes=5, rank_peaks=[5])
    log = tmp_path / "termination-log"
    log.write_text('{"engine": "ddp", "reason": "the script\'s"}')
    write_termination(log, done)
    assert json.loads(log.read_text()) == {"engine": "ddp", "reason": "Completed", "peakBytes": 5, "rankPeaks": [5]}
    log.write_text("finished fine")  # not JSON: the script's words stay
    write_termination(log, done)
    assert log.read_text() == "finished fine"


def test_a_script_that_never_stepped_reports_no_peak_to_learn_from(tmp_path: Path) -> None:
    """A zero peak would teach the planner that the script needs nothing: no Completed message then."""
    proc = monitored(tmp_path, ["--mode", "never-steps", "--steps", "2", "--micro-batch", "2"])
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert not (tmp_path / "termination-log").exists()

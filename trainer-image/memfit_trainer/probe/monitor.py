"""Run a training pod's own command under the probe: progress, the first-steps check and the measured peak.

`python3 /memfit/probe/memfit_probe.py monitor -- COMMAND...` (memfit's training pod of a `spec.container` job,
docs/own-code.md) runs the user's command once, unchanged, with the probe's hooks in every Python process
it starts (memfit_trainer.probe.hooks, monitor mode) and:

- serves rank 0's progress on `$MEMFIT_METRICS_PORT` in the series memfit's trainer serves (steps, step
  seconds, largest peak, and the loss and eval loss when the script reports them: the Hugging Face Trainer's
  logs, or memfit_trainer.probe.report; memfit.api.pod), so the operator's `status.progress` reads a script
  as it reads its own trainer. The steps are the optimizer steps this pod ran (a script that resumed from its own
  checkpoint counts from there: the probe cannot see the script's step counter);
- checks the first `$MEMFIT_FIRST_STEPS` steps against the plan's prediction plus headroom (the Plan at
  `$MEMFIT_PLAN_PATH`): a rank whose peak is above it ends the script, and the pod exits with
  MemoryOverPlan's code and message, so the operator re-plans before an out-of-memory, as for its own trainer;
- on success, writes a `Completed` termination message with every rank's measured peak (what the operator
  learns from), added to a JSON object the script wrote there itself (a script's other text is left alone);
  on any other end, exits as the script did and writes nothing (the container's log tail is its termination
  message).

SIGTERM and SIGINT are passed on to the script's process group (the pod is being deleted or preempted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from memfit.api import pod as contract
from memfit.api.termination import (
    DEVICE_CPU,
    DEVICE_CUDA,
    DEVICE_SIMULATED_CUDA,
    EXIT_MEMORY_OVER_PLAN,
    KEY_BUDGET_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_RANK_PEAKS,
    TerminationMessage,
    TerminationReason,
)

from memfit_trainer.probe.driver import read_results
from memfit_trainer.probe.env import (
    DEFAULT_PROBE_STEPS,
    ENV_PROBE_BUDGET_BYTES,
    ENV_PROBE_MONITOR,
    ENV_PROBE_OUT,
    ENV_PROBE_STEPS,
    STARTUP_DIR,
)
from memfit_trainer.probe.records import OVER_PLAN, ProbeResult

RETRY_SECONDS = 2.0
SIMULATED_METER = "simulated-gpu"  # memfit_trainer.meters: the CPU under a simulated GPU budget (the test bed)


@dataclass(frozen=True, slots=True)
class FirstSteps:
    """How many first steps are checked, against what (None: no check)."""

    steps: int
    predicted_bytes: int
    budget_bytes: int | None


def first_steps(environ: Mapping[str, str]) -> FirstSteps:
    """The check memfit's trainer runs (memfit_trainer.first_steps), from the pod's Plan and variables; off
    when `$MEMFIT_FIRST_STEPS` is 0 or the plan has no prediction."""
    raw = environ.get(contract.ENV_FIRST_STEPS, "").strip()
    steps = int(raw) if raw.isdigit() else DEFAULT_PROBE_STEPS
    plan_path = environ.get(contract.ENV_PLAN_PATH, "")
    predicted, headroom = 0, 0
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
        predicted = int(plan["memory"]["peakBytes"])
        headroom = int(plan.get("headroomPercent", 0))
    if steps <= 0 or predicted <= 0:
        return FirstSteps(max(1, steps), predicted, None)
    return FirstSteps(steps, predicted, int(predicted * (1 + headroom / 100)))


def child_env(environ: Mapping[str, str], *, out: Path, check: FirstSteps) -> dict[str, str]:
    """The script's environment: the pod's, and the probe's hooks in monitor mode."""
    env = dict(environ)
    env[ENV_PROBE_OUT] = str(out)
    env[ENV_PROBE_STEPS] = str(check.steps)
    env[ENV_PROBE_MONITOR] = "1"
    if check.budget_bytes is not None:
        env[ENV_PROBE_BUDGET_BYTES] = str(check.budget_bytes)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STARTUP_DIR), environ.get("PYTHONPATH", "")) if p)
    return env


# ------------------------------------------------------------------------------------------ progress


def _lowest_rank(out: Path) -> ProbeResult | None:
    """This pod's first rank (rank 0 in the pod of completion index 0): the one whose progress is served."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        results = read_results(out)
        return min(results, key=lambda r: r.rank) if results else None
    return None


def exposition(result: ProbeResult | None, *, job: str) -> str:
    """Prometheus text of the progress series memfit's trainer serves (memfit.api.pod), from a rank's result."""
    rank = str(result.rank) if result is not None else "0"
    labels = f'{{job="{_escape(job)}",rank="{rank}"}}'
    steps = result.steps_read if result is not None else 0
    seconds = result.step_seconds_sum if result is not None else 0.0
    peak = result.max_peak_bytes if result is not None else 0
    lines = [
        f"# TYPE {contract.METRIC_STEP} gauge", f"{contract.METRIC_STEP}{labels} {steps}",
        f"# TYPE {contract.METRIC_STEP_SECONDS} summary",
        f"{contract.METRIC_STEP_SECONDS_SUM}{labels} {seconds}",
        f"{contract.METRIC_STEP_SECONDS_COUNT}{labels} {steps}",
        f"# TYPE {contract.METRIC_RESUMED_FROM_STEP} gauge", f"{contract.METRIC_RESUMED_FROM_STEP}{labels} -1",
        "# TYPE memfit_trainer_peak_bytes gauge", f"memfit_trainer_peak_bytes{labels} {peak}",
    ]  # fmt: skip
    for name, value in ((contract.METRIC_LOSS, result.loss if result else None),
                        (contract.METRIC_EVAL_LOSS, result.eval_loss if result else None)):  # fmt: skip
        if value is not None:
            lines += [f"# TYPE {name} gauge", f"{name}{labels} {value}"]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve_progress(port: int, *, out: Path, job: str, host: str = "") -> ThreadingHTTPServer | None:
    """Serve `exposition` of the pod's first rank on `port` (None when the port is taken)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition(_lowest_rank(out), job=job).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError:
        return None
    threading.Thread(target=server.serve_forever, name="memfit-progress", daemon=True).start()
    return server


class Progress:
    """`serve_progress`, retried every few seconds while the port is taken (a pod this one replaces on a shared
    host network, the local test bed's loopback), until `stop`."""

    def __init__(self, port: int, *, out: Path, job: str, host: str = "") -> None:
        self._server: ThreadingHTTPServer | None = None
        self._stopped = threading.Event()
        self._args = (port, out, job, host)
        threading.Thread(target=self._serve, name="memfit-progress-bind", daemon=True).start()

    def _serve(self) -> None:
        port, out, job, host = self._args
        said = False
        while not self._stopped.is_set():
            self._server = serve_progress(port, out=out, job=job, host=host)
            if self._server is not None:
                return
            if not said:
                print(f"memfit probe: port {port} is taken; serving progress once it is free", file=sys.stderr, flush=True)
                said = True
            if self._stopped.wait(RETRY_SECONDS):
                return

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# ------------------------------------------------------------------------------------------ the end


def device_of(result: ProbeResult) -> str:
    if result.memory_meter == SIMULATED_METER:
        return DEVICE_SIMULATED_CUDA
    return DEVICE_CUDA if result.device == "cuda" else DEVICE_CPU


def termination(results: Sequence[ProbeResult], exit_code: int) -> tuple[TerminationMessage | None, int]:
    """The termination message and exit code of the pod: MemoryOverPlan when a rank's first steps measured
    more than the plan allows, Completed with every rank's peak when the script succeeded after at least one
    measured step, else none and the script's own code."""
    ranks = sorted(results, key=lambda r: r.rank)
    over = next((r for r in ranks if r.ended == OVER_PLAN), None)
    peaks = [r.max_peak_bytes for r in ranks][:MAX_RANK_PEAKS]
    reserved = [r.max_reserved_peak_bytes for r in ranks if r.max_reserved_peak_bytes is not None]
    if over is not None:
        step = over.steps[-1] if over.steps else None
        measured = over.over_plan_bytes or over.max_peak_bytes
        budget = over.budget_bytes or 0
        text = (f"measured peak {measured / 2**30:.2f} GiB at step {step.step if step else 0} exceeds the plan's "
                f"prediction plus headroom ({budget / 2**30:.2f} GiB): stopping before an out-of-memory to re-plan")
        return TerminationMessage(
            reason=TerminationReason.MEMORY_OVER_PLAN, rank=over.rank, step=step.step if step else 0,
            peak_bytes=measured, memory_meter=over.memory_meter, rank_peaks=peaks or None,
            reserved_peak_bytes=max(reserved) if reserved else None, device=device_of(over), message=text,
            extra={KEY_BUDGET_BYTES: budget}), EXIT_MEMORY_OVER_PLAN  # fmt: skip
    if exit_code != 0 or not any(r.steps_read for r in ranks):
        return None, exit_code  # nothing measured (a script that never stepped): nothing to learn from
    first = ranks[0]
    timed = first.steps_read - 1  # the first step builds optimizer state and warms up: left out, as the trainer does
    first_seconds = first.steps[0].step_seconds if first.steps else 0.0
    mean = (first.step_seconds_sum - first_seconds) / timed if timed > 0 else None
    return TerminationMessage(
        reason=TerminationReason.COMPLETED, rank=first.rank, steps=first.steps_read, peak_bytes=max(peaks),
        memory_meter=first.memory_meter, rank_peaks=peaks, reserved_peak_bytes=max(reserved) if reserved else None,
        device=device_of(first), step_seconds=round(mean, 6) if mean is not None else None,
        final_loss=first.loss, eval_loss=first.eval_loss), 0  # fmt: skip


def run_monitored(command: Sequence[str], *, port: int | None, termination_log: Path | None,
                  environ: Mapping[str, str] | None = None, host: str = "") -> int:
    """Run `command` to its end under the probe; the pod's exit code (module docstring)."""
    environ = dict(os.environ if environ is None else environ)
    check = first_steps(environ)
    with tempfile.TemporaryDirectory(prefix="memfit-monitor-") as work:
        out = Path(work) / "rank.json"
        server = Progress(port, out=out, job=environ.get(contract.ENV_JOB, ""), host=host) if port else None
        process = subprocess.Popen(list(command), env=child_env(environ, out=out, check=check), start_new_session=True)
        previous = {sig: signal.signal(sig, _forward(process)) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = process.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if server is not None:
                server.stop()
        exit_code = code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
        message, exit_code = termination(read_results(out), exit_code)
    if message is not None and termination_log is not None:
        write_termination(termination_log, message)
    if message is not None and message.reason == TerminationReason.MEMORY_OVER_PLAN:
        print(f"memfit probe: {message.message}", file=sys.stderr, flush=True)
    return exit_code


def write_termination(path: Path, message: TerminationMessage) -> None:
    """Write memfit's message in place (/dev/termination-log is never renamed over). A script that wrote its
    own message keeps it: memfit's keys are added to its JSON object; any other text of its own stays as it is."""
    own = ""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        own = path.read_text(encoding="utf-8").strip()
    text = message.to_json()
    if own:
        try:
            theirs = json.loads(own)
        except ValueError:
            return
        if not isinstance(theirs, dict):
            return
        merged = json.dumps({**theirs, **json.loads(text)}, separators=(",", ":"))
        text = merged if len(merged.encode()) <= MAX_MESSAGE_BYTES else text
    path.write_text(text, encoding="utf-8")


def _forward(process: subprocess.Popen[bytes]) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    return handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 memfit_probe.py monitor",
                                     description="run a training command under memfit's probe (a training pod)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help=f"serve progress here (default ${contract.ENV_METRICS_PORT}; 0: none)")
    parser.add_argument("--termination-log", type=Path, default=None, help="write the termination message here")
    parser.add_argument("user_command", nargs=argparse.REMAINDER, help="the training command, after --")
    args = parser.parse_args(argv)
    command = args.user_command[1:] if args.user_command[:1] == ["--"] else args.user_command
    if not command:
        print("memfit probe monitor: no command: pass it after --", file=sys.stderr)
        return 2
    port = args.metrics_port
    if port is None:
        raw = os.environ.get(contract.ENV_METRICS_PORT, "")
        port = int(raw) if raw.isdigit() else None
    return run_monitored(command, port=port or None, termination_log=args.termination_log)

"""Run a user's command once per micro-batch under the probe and write one summary (`memfit-trainer probe`).

Each run is its own process group with memfit's plan variables (the micro-batch, accumulation 1, a large
step limit) and the probe's; it ends itself after the probed steps, or is killed at the timeout. The
ladder goes up until a run is out of memory (then it stops) or a run shows a finding (the script, not
the micro-batch, is at fault: the next rung would say the same).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from memfit.api import pod as contract

from memfit_trainer.probe.env import ENV_PROBE_OUT, ENV_PROBE_STEPS, STARTUP_DIR
from memfit_trainer.probe.expansion import expand_command
from memfit_trainer.probe.findings import Outcome, RunFacts, judge, last_lines
from memfit_trainer.probe.records import ProbeResult, write_atomic
from memfit_trainer.probe.summary import Point, summarize

PROBE_MAX_STEPS = 1_000_000  # MEMFIT_MAX_STEPS for a probed run: the probe, not the script, ends it
KILL_GRACE_SECONDS = 5.0
MIN_RUN_SECONDS = 5.0  # no run starts with less time than this before the deadline
RESULT_FILE = "probe.json"
TERMINATION_MAX = 4096  # the kubelet keeps at most 4 KiB of a container's termination message


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    command: tuple[str, ...]
    micro_batches: tuple[int, ...]
    steps: int = 3
    timeout_seconds: float = 300.0
    expand_variables: bool = False  # $(NAME) in the command expanded per run (memfit's profiling pod)
    deadline: float | None = None  # time.time() by which the whole ladder must end (memfit's profiling pod)


def probe_env(environ: Mapping[str, str], *, micro_batch: int, steps: int, out: Path) -> dict[str, str]:
    """The run's environment: the caller's, the plan's knobs for this micro-batch, and the probe's."""
    env = dict(environ)
    env[contract.ENV_MICRO_BATCH_SIZE] = str(micro_batch)
    env[contract.ENV_GRADIENT_ACCUMULATION_STEPS] = "1"
    env[contract.ENV_MAX_STEPS] = str(PROBE_MAX_STEPS)
    for folder in (contract.ENV_CHECKPOINT_DIR, contract.ENV_OUTPUT_DIR):
        if env.get(folder):  # a folder of this run's own: a probed run never resumes from another's checkpoint
            env[folder] = f"{env[folder].rstrip('/')}/micro-batch-{micro_batch}"
    env[ENV_PROBE_OUT] = str(out)
    env[ENV_PROBE_STEPS] = str(steps)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STARTUP_DIR), environ.get("PYTHONPATH", "")) if p)
    return env


def deepspeed_config_for(env: dict[str, str], micro_batch: int, folder: Path) -> None:
    """A script that takes memfit's DeepSpeed config gets this run's copy: the config at `$MEMFIT_DEEPSPEED_CONFIG`
    with this micro-batch, no accumulation and the matching total batch over the ranks torchrun starts
    (DeepSpeed refuses a config whose three batch values disagree, and the HF Trainer one that disagrees with
    its arguments). Nothing without such a file."""
    source = env.get(contract.ENV_DEEPSPEED_CONFIG)
    if not source or not Path(source).is_file():
        return
    config = json.loads(Path(source).read_text(encoding="utf-8"))
    ranks = int(env.get(contract.ENV_NNODES) or 1) * int(env.get(contract.ENV_NPROC_PER_NODE) or 1)
    config |= {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
               "train_batch_size": micro_batch * ranks}
    target = folder / "deepspeed.json"
    target.write_text(json.dumps(config, indent=2), encoding="utf-8")
    env[contract.ENV_DEEPSPEED_CONFIG] = str(target)


def run_timeout(options: ProbeOptions) -> float:
    """The seconds the next run may take: `--timeout`, or less where the ladder's deadline comes first."""
    if options.deadline is None:
        return options.timeout_seconds
    return max(0.0, min(options.timeout_seconds, options.deadline - time.time()))


def run_once(options: ProbeOptions, micro_batch: int, folder: Path) -> tuple[RunFacts, list[ProbeResult]]:
    """Run the command at one micro-batch; what was seen, and every rank's result. The run's stderr is kept
    for the finding's last lines and passed on to the probe's own stderr (the container's log)."""
    timeout = run_timeout(options)
    out = folder / RESULT_FILE
    env = probe_env(os.environ, micro_batch=micro_batch, steps=options.steps, out=out)
    deepspeed_config_for(env, micro_batch, folder)
    with open(folder / "stderr.log", "w+b") as stderr:
        command = expand_command(options.command, env) if options.expand_variables else options.command
        process = subprocess.Popen(command, env=env, stderr=stderr, start_new_session=True)
        try:
            exit_code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            exit_code = None
        stderr.seek(0)
        text = stderr.read().decode("utf-8", errors="replace")
        tail = last_lines(text)
    if text:
        print(f"memfit probe: micro-batch {micro_batch}: the run's stderr:\n{text.rstrip()}", file=sys.stderr, flush=True)
    results = read_results(out)
    rank0 = next((r for r in results if r.rank == 0), None)
    facts = RunFacts(micro_batch=micro_batch, steps_wanted=options.steps, exit_code=exit_code,
                     timeout_seconds=round(timeout), stderr_tail=tail, result=rank0)  # fmt: skip
    return facts, results


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the run's whole process group (torchrun and its workers), SIGKILL after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_GRACE_SECONDS)
    with contextlib.suppress(ProcessLookupError):  # workers that outlived the leader, or ignored SIGTERM
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def read_results(out: Path) -> list[ProbeResult]:
    """Rank 0's result and those of the other ranks beside it."""
    paths = sorted(p for p in out.parent.glob(out.name + "*") if not p.name.startswith("."))
    return [ProbeResult.from_json(p.read_text(encoding="utf-8")) for p in paths]


def probe_ladder(options: ProbeOptions, work: Path) -> list[Point]:
    """One point per micro-batch, smallest first, up to the first out-of-memory run or finding."""
    points: list[Point] = []
    for micro_batch in sorted(set(options.micro_batches)):
        if run_timeout(options) < MIN_RUN_SECONDS:  # the deadline is (nearly) here: what was measured stands
            print(f"memfit probe: micro-batch {micro_batch}: not run, the probe's deadline has passed",
                  file=sys.stderr, flush=True)  # fmt: skip
            break
        folder = work / f"micro-batch-{micro_batch}"
        folder.mkdir(parents=True, exist_ok=True)
        facts, results = run_once(options, micro_batch, folder)
        verdict = judge(facts)
        points.append(summarize(micro_batch, verdict, results))
        print(
            f"memfit probe: micro-batch {micro_batch}: {verdict.outcome.value}", file=sys.stderr, flush=True
        )
        if verdict.outcome is not Outcome.MEASURED:
            break
    return points


def succeeded(points: Sequence[Point]) -> bool:
    """Every micro-batch measured, or the ladder stopped at an out-of-memory run after a measured one."""
    if not points or any(p.outcome not in (Outcome.MEASURED, Outcome.OUT_OF_MEMORY) for p in points):
        return False
    return points[0].outcome is Outcome.MEASURED


def summary_json(options: ProbeOptions, points: Sequence[Point]) -> str:
    findings = [p.finding for p in points if p.finding and p.outcome is not Outcome.OUT_OF_MEMORY]
    measured = [p.micro_batch for p in points if p.outcome is Outcome.MEASURED]
    oom = next((p.micro_batch for p in points if p.outcome is Outcome.OUT_OF_MEMORY), None)
    return json.dumps({"command": list(options.command), "steps": options.steps,
                       "microBatches": list(options.micro_batches), "measuredMicroBatches": measured,
                       "outOfMemoryMicroBatch": oom, "findings": findings,
                       "points": [p.to_wire() for p in points]}, indent=2)  # fmt: skip


def termination_json(options: ProbeOptions, points: Sequence[Point]) -> str:
    """The summary without the command, at most TERMINATION_MAX bytes: what memfit's operator reads from
    the probe container's termination message (memfit.lifecycle.probe_points). A long finding (the last
    lines of a script's stderr) is shortened from its start, so its last lines stay."""
    wire = json.loads(summary_json(options, points))
    wire.pop("command")
    for point in wire["points"]:
        point.pop("finding", None)
    text = json.dumps(wire, separators=(",", ":"))
    room = TERMINATION_MAX - len(text) - 16 * (len(wire["findings"]) + 1)
    each = max(64, room // max(1, len(wire["findings"])))
    wire["findings"] = [f if len(f) <= each else "..." + f[-(each - 3):] for f in wire["findings"]]
    return json.dumps(wire, separators=(",", ":"))[:TERMINATION_MAX]


def run_probe(options: ProbeOptions, out: Path, *, termination_log: Path | None = None) -> int:
    """Probe the command over the micro-batches, write the summary to `out` (and the compact one to
    `termination_log`); 0 when it succeeded."""
    with tempfile.TemporaryDirectory(prefix="memfit-probe-") as work:
        points = probe_ladder(options, Path(work))
    write_atomic(out, summary_json(options, points))
    if termination_log is not None:  # /dev/termination-log: written in place, never renamed over
        termination_log.write_text(termination_json(options, points), encoding="utf-8")
    if succeeded(points):
        return 0
    failures = [p for p in points if p.outcome is not Outcome.MEASURED]
    for point in failures:
        print(f"memfit probe: {point.finding}", file=sys.stderr)
    return 1

"""The probe's command line: `memfit-trainer probe ...` and, from the bundle in a user's image,
`python3 -m memfit_trainer.probe ...` (the same arguments); `... monitor -- COMMAND` runs a training pod's
command once under the probe (memfit_trainer.probe.monitor)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

USAGE = ("memfit-trainer probe --micro-batches 1,2,4 [--steps 3] [--timeout 300] --out PATH "
         "[--termination-log PATH] [--expand-variables] [--budget S [--started-at FILE]] [--report-only] -- COMMAND...")


def micro_batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,4; got {text!r}")
    return values


def add_arguments(probe: argparse.ArgumentParser) -> None:
    probe.add_argument("--micro-batches", type=micro_batches, required=True, help="comma-separated, e.g. 1,2,4")
    probe.add_argument("--steps", type=int, default=3, help="optimizer steps measured per micro-batch")
    probe.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is killed")
    probe.add_argument("--out", type=Path, required=True, help="the summary JSON")
    probe.add_argument("--termination-log", type=Path, default=None,
                       help="also write the compact summary the operator reads (at most 4 KiB) here")
    probe.add_argument("--expand-variables", action="store_true",
                       help="expand $(NAME) in the command per run, as Kubernetes does (memfit_trainer.probe.expansion)")
    probe.add_argument("--budget", type=float, default=None,
                       help="seconds the whole ladder may take, counted from the time in --started-at (or from now)")
    probe.add_argument("--started-at", type=Path, default=None,
                       help="a file holding the epoch seconds the budget counts from (memfit-trainer probe-bundle writes "
                       "one: the profiling pod's first container started then)")
    probe.add_argument("--report-only", action="store_true",
                       help="exit 0 once the summary is written, findings or not (memfit's profiling pod: the operator "
                       "reads them from the termination log; a failed pod would only be retried)")
    probe.add_argument("user_command", nargs=argparse.REMAINDER, help="the training command, after --")


def deadline(budget: float | None, started_at: Path | None) -> float | None:
    """When the ladder must end: `budget` seconds after the time in `started_at` (now, without one)."""
    if budget is None:
        return None
    start = time.time()
    if started_at is not None and started_at.is_file():
        with contextlib.suppress(ValueError):
            start = float(started_at.read_text(encoding="utf-8").strip())
    return start + budget


def run(args: argparse.Namespace) -> int:
    from memfit_trainer.probe.driver import ProbeOptions, run_probe

    command = args.user_command[1:] if args.user_command[:1] == ["--"] else args.user_command
    if not command:
        print("memfit-trainer probe: no command: pass it after --", file=sys.stderr)
        return 2
    options = ProbeOptions(command=tuple(command), micro_batches=args.micro_batches, steps=max(1, args.steps),
                           timeout_seconds=args.timeout, expand_variables=args.expand_variables,
                           deadline=deadline(args.budget, args.started_at))  # fmt: skip
    code = run_probe(options, args.out, termination_log=args.termination_log)
    return 0 if args.report_only else code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["monitor"]:  # a training pod: run the command once under the probe (probe.monitor)
        from memfit_trainer.probe.monitor import main as monitor

        return monitor(argv[1:])
    parser = argparse.ArgumentParser(prog="python3 -m memfit_trainer.probe", usage=USAGE,
                                     description="profile your own training command once per micro-batch")
    add_arguments(parser)
    return run(parser.parse_args(argv))

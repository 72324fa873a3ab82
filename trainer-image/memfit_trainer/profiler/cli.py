"""`memfit-trainer profile --problem P.json --out profile.json`: measure a problem, emit its Profile.

Exit codes: 0 profiled; 2 invalid input (the Profile's `error` names the field; retrying cannot help);
3 profiling failed (no configuration could be measured). Every exit writes a Profile to --out, stdout
and the termination-message path.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from memfit_trainer.profiler.configs import DEFAULT_CONFIGS, optimizer_kind, parse_configs
from memfit_trainer.profiler.errors import (
    EXIT_INVALID_PROBLEM,
    EXIT_OK,
    EXIT_PROFILE_FAILED,
    ProfileInputError,
    ProfileRunError,
)

DESCRIPTION = "Measure a problem's peak memory, step time and FLOPs; write the Profile JSON."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `profile` options (shared by `memfit-trainer profile` and `python -m`)."""
    default_keys = ",".join(c.key for c in DEFAULT_CONFIGS)
    parser.add_argument(
        "--problem", type=Path, required=True, help="Problem wire JSON (a MOTJ spec.problem)."
    )
    parser.add_argument("--out", type=Path, default=None, help="Write the Profile JSON here too.")
    parser.add_argument(
        "--configs",
        default="default",
        help="precision:checkpointing:microBatch[:8bit] list, `default` or `grid` (16 points). "
        f"default = {default_keys}",
    )
    parser.add_argument(
        "--optimizer", default="adamw", help="adamw, adam or sgd (the job's training.optimizer)."
    )
    parser.add_argument("--device", default="auto", help="auto (first GPU, else CPU), cpu, cuda or cuda:N.")
    parser.add_argument(
        "--compute",
        default="auto",
        choices=("auto", "full", "elide", "elide-compute"),
        help="elide: skip the arithmetic, keep every allocation; elide-compute: skip only the matmul and "
        "attention arithmetic; full: real steps. auto: elide on a CPU, full on a GPU (docs/profiler.md).",
    )
    parser.add_argument(
        "--optimizer8bit",
        default="auto",
        choices=("auto", "on", "off"),
        help="The job's strategy.optimizer8bit: off drops the 8-bit configurations (bitsandbytes never runs).",
    )
    parser.add_argument(
        "--engine",
        default="none",
        choices=("ddp", "none"),
        help="none: the bare model, as the trainer runs world size 1 (default); ddp: under "
        "DistributedDataParallel on one rank.",
    )
    parser.add_argument(
        "--curves",
        default="auto",
        choices=("auto", "on", "off"),
        help="Measure activation curves (per-sample terms): auto = for problems without an analytic form.",
    )
    parser.add_argument(
        "--depth",
        default="full",
        choices=("full", "reduced"),
        help="reduced: count the full model on the meta device and measure 1 and 2 of its repeated blocks "
        "(models too large for the profiling device); full: the whole model.",
    )
    parser.add_argument("--steps", type=int, default=None, help="Measured steps per configuration.")
    parser.add_argument("--seed", type=int, default=0, help="Seed for the initial weights and data.")
    parser.add_argument(
        "--verbose", action="store_true", help="Print a table of the measured points to stderr."
    )
    parser.add_argument(
        "--lora-targets", default="",
        help="Comma-separated LoRA target modules the job allows (strategy.peft): checked against the model.",
    )
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank to check against the targets.")
    parser.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout of the measured variant.")
    parser.add_argument(
        "--peft-methods", default="",
        help="Comma-separated lora/qlora: also measure the job's adapters on a frozen base (needs --lora-targets).",
    )
    parser.add_argument("--qlora-quant", choices=["nf4", "fp4"], default="nf4", help="QLoRA 4-bit type.")
    parser.add_argument("--qlora-double-quant", choices=["on", "off"], default="on", help="QLoRA double quantisation.")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `profile` sub-command to a parent parser; it dispatches to `run_from_args`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "profile", help=DESCRIPTION, description=DESCRIPTION
    )
    add_arguments(parser)
    parser.set_defaults(func=run_from_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse `argv` (without the `profile` word) and run; returns the exit code."""
    parser = argparse.ArgumentParser(prog="memfit-trainer profile", description=DESCRIPTION)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def run_from_args(args: argparse.Namespace) -> int:
    """Run a profile and emit the result (or the error) as a Profile; returns the exit code."""
    from memfit_trainer.profiler.emit import emit_profile
    from memfit_trainer.profiler.inputs import load_problem
    from memfit_trainer.profiler.run import ProfileOptions, error_profile, profile_problem

    started = time.perf_counter()
    spec = None
    try:
        spec = load_problem(args.problem)
        if args.steps is not None and args.steps < 1:
            raise ProfileInputError("steps", f"must be >= 1, got {args.steps}")
        configs = parse_configs(args.configs)
        if args.optimizer8bit == "off":
            configs = tuple(c for c in configs if not c.optimizer8bit)
        options = ProfileOptions(
            configs=configs,
            optimizer=optimizer_kind(args.optimizer),
            device=args.device,
            compute=args.compute,
            steps_per_config=args.steps,
            seed=args.seed,
            ddp=args.engine == "ddp",
            curves=args.curves,
            depth=args.depth,
            lora_targets=tuple(t for t in args.lora_targets.split(",") if t),
            lora_rank=args.lora_rank,
            lora_dropout=args.lora_dropout,
            peft_methods=tuple(m for m in args.peft_methods.split(",") if m in ("lora", "qlora")),
            qlora_quant=args.qlora_quant,
            qlora_double_quant=args.qlora_double_quant == "on",
        )
        outcome = profile_problem(spec, options)
    except ProfileInputError as exc:
        print(f"memfit-trainer profile: invalid input: {exc}", file=sys.stderr)
        emit_profile(error_profile(spec, str(exc), seconds=time.perf_counter() - started), out=args.out)
        return EXIT_INVALID_PROBLEM
    except ProfileRunError as exc:
        print(f"memfit-trainer profile: failed: {exc}", file=sys.stderr)
        emit_profile(error_profile(spec, str(exc), seconds=time.perf_counter() - started), out=args.out)
        return EXIT_PROFILE_FAILED
    except Exception as exc:  # a crash in user code or torch: still tell the operator why
        traceback.print_exc()
        message = f"profiling crashed: {type(exc).__name__}: {exc}"
        emit_profile(error_profile(spec, message, seconds=time.perf_counter() - started), out=args.out)
        return EXIT_PROFILE_FAILED
    if args.verbose:
        _print_table(outcome.results)
    emit_profile(outcome.profile, out=args.out)
    return EXIT_OK


def _print_table(results: list[Any]) -> None:
    print(f"{'config':<24} {'peak MiB':>10} {'step s':>8}  error", file=sys.stderr)
    for r in results:
        peak = f"{r.peak_allocated_bytes / 2**20:10.1f}" if r.error is None else f"{'-':>10}"
        print(f"{r.config.key:<24} {peak} {r.step_seconds:8.3f}  {r.error or ''}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())

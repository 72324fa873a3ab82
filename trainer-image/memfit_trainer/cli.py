"""`memfit-trainer`: train a Plan, fetch its hub model, probe a user's own command (profile lives in
memfit_trainer.profiler, loaded when present)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from memfit.api import pod as contract

ENV_PLAN_PATH = contract.ENV_PLAN_PATH


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memfit-trainer", description="memfit's in-pod trainer and profiler"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train with the configuration a Plan chose")
    train.add_argument(
        "--plan",
        type=Path,
        default=os.environ.get(ENV_PLAN_PATH),
        help=f"Plan JSON (default ${ENV_PLAN_PATH})",
    )
    train.add_argument("--report-dir", type=Path, default=None, help="write a per-rank JSON run report here")
    fetch = commands.add_parser(
        "fetch", help="download the Plan's hub model into HF_HOME (a training pod's init container)"
    )
    fetch.add_argument("--plan", type=Path, default=os.environ.get(ENV_PLAN_PATH), help=f"default ${ENV_PLAN_PATH}")
    config = commands.add_parser("deepspeed-config", help="print the DeepSpeed config derived from a Plan")
    config.add_argument("--plan", type=Path, required=True)
    config.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=True, help="config for GPUs")
    commands.add_parser(
        "profile", help="measure a problem's memory (memfit_trainer.profiler)", add_help=False
    )
    _probe_parser(commands)
    return parser


def _probe_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from memfit_trainer.probe.command import USAGE, add_arguments

    probe = commands.add_parser(
        "probe", help="profile your own training command once per micro-batch (memfit_trainer.probe)", usage=USAGE
    )
    add_arguments(probe)
    bundle = commands.add_parser("probe-bundle", help="copy the probe's Python files for a user's image")
    bundle.add_argument("--to", type=Path, required=True, help="the folder (a PYTHONPATH entry)")


def _train(args: argparse.Namespace) -> int:
    from memfit_trainer.dist import read_dist_env
    from memfit_trainer.plan_check import (
        InvalidPlanError,
        RuntimeFacts,
        load_plan,
        plan_problems,
        refuse_invalid,
    )

    env = read_dist_env(os.environ)
    rank = env.rank if env.under_launcher else None
    try:
        if args.plan is None:
            raise InvalidPlanError(f"no plan: pass --plan or set ${ENV_PLAN_PATH}")
        plan = load_plan(args.plan)
        # What no device could fix is refused before torch is even imported (the worker checks again,
        # with the device's bf16 and async I/O support).
        world_size = env.world_size if env.under_launcher else plan.world_size
        static = plan_problems(plan, RuntimeFacts(world_size=world_size, cuda=True))
        if static:
            raise InvalidPlanError("; ".join(static))
    except InvalidPlanError as error:
        print(f"memfit-trainer: InvalidPlan: {error}", file=sys.stderr)
        return refuse_invalid(error, rank=rank, environ=os.environ)

    # Imported here: torch and the engines are heavy, and `profile` must not pay for them.
    from memfit_trainer.worker import configure_logging, train_process

    configure_logging()
    extra = ["--report-dir", str(args.report_dir)] if args.report_dir else []
    if not env.under_launcher and plan.world_size > 1:
        from memfit_trainer.launch import launch

        return launch(plan, plan_path=args.plan, extra=extra, environ=os.environ)
    return train_process(args.plan, report_dir=args.report_dir, environ=os.environ)


def _profile(argv: list[str]) -> int:
    try:
        profiler_cli = importlib.import_module("memfit_trainer.profiler.cli")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("memfit_trainer.profiler"):
            print("memfit-trainer profile: the profiler is not part of this image", file=sys.stderr)
            return 2
        raise
    return int(profiler_cli.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `memfit-trainer` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["profile"]:
        return _profile(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "train":
        return _train(args)
    if args.command == "fetch":
        from memfit_trainer import fetch as download

        if args.plan is None:
            print(f"memfit-trainer fetch: no plan: pass --plan or set ${ENV_PLAN_PATH}", file=sys.stderr)
            return 2
        return download.main(args.plan)
    if args.command == "probe":
        from memfit_trainer.probe.command import run as probe

        return probe(args)
    if args.command == "probe-bundle":
        from memfit_trainer.probe.bundle import write_bundle

        print(f"memfit-trainer probe-bundle: {len(write_bundle(args.to))} files in {args.to}")
        return 0
    if args.command == "deepspeed-config":
        from memfit_trainer.plan_check import load_plan
        from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config

        print(json.dumps(build_deepspeed_config(load_plan(args.plan), cuda=args.cuda), indent=2))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())

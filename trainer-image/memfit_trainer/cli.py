"""`memfit-trainer`: train a Plan (profile lives in memfit_trainer.profiler, loaded when present)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

ENV_PLAN_PATH = "MEMFIT_PLAN_PATH"


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
    config = commands.add_parser("deepspeed-config", help="print the DeepSpeed config derived from a Plan")
    config.add_argument("--plan", type=Path, required=True)
    config.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=True, help="config for GPUs")
    commands.add_parser(
        "profile", help="measure a problem's memory (memfit_trainer.profiler)", add_help=False
    )
    return parser


def _train(args: argparse.Namespace) -> int:
    # Imported here: torch and the engines are heavy, and `profile` must not pay for them.
    from memfit_trainer.dist import under_launcher
    from memfit_trainer.plan_check import InvalidPlanError, RuntimeFacts, plan_problems
    from memfit_trainer.worker import configure_logging, load_plan, refuse_invalid, train_process

    configure_logging()
    if args.plan is None:
        return refuse_invalid(InvalidPlanError(f"no plan: pass --plan or set ${ENV_PLAN_PATH}"), rank=None,
                              environ=os.environ)  # fmt: skip
    extra = ["--report-dir", str(args.report_dir)] if args.report_dir else []
    if not under_launcher(os.environ):
        try:
            plan = load_plan(args.plan)
        except InvalidPlanError as error:
            return refuse_invalid(error, rank=None, environ=os.environ)
        if plan.world_size > 1:
            from memfit_trainer.launch import launch

            # Refuse what no worker could run before starting any (the workers check again, with devices).
            static = [
                r for r in plan_problems(plan, RuntimeFacts(world_size=plan.world_size, cuda=True)) if r
            ]
            if static:
                return refuse_invalid(InvalidPlanError("; ".join(static)), rank=None, environ=os.environ)
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
    if args.command == "deepspeed-config":
        from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config
        from memfit_trainer.worker import load_plan

        print(json.dumps(build_deepspeed_config(load_plan(args.plan), cuda=args.cuda), indent=2))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())

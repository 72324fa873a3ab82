"""`memfit plan`: the planner from the command line, on the built-in catalog or the given pools.

Exit codes: 0 planned, 1 nothing fits (the reasons are printed), 2 invalid input (field paths, no
traceback). Files are read here; the decision is the pure planner's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from memfit.catalog import CATALOG
from memfit.cli.inputs import InputError, load_job, load_pools, load_profile
from memfit.cli.render import draw_chart, plan_title, render_result
from memfit.memory import ShapeError, shape_from_problem
from memfit.planner import catalog_pools, plan


def cmd_plan(args: argparse.Namespace) -> int:
    """`memfit plan JOB.yaml [--pools P.yaml] [--profile P.json] [--json] [--chart OUT.png]`."""
    try:
        job = load_job(Path(args.job), allow_impossible_pins=True)
        pools, invalid = load_pools(Path(args.pools)) if args.pools else (catalog_pools(CATALOG), [])
        profile = load_profile(Path(args.profile)) if args.profile else None
    except InputError as error:
        return error.report()
    result = plan(job.spec, pools=pools, profile=profile, catalog=CATALOG)
    if invalid:
        result = replace(result, rejections=(*invalid, *result.rejections))
    if args.json:
        if result.plan is not None:
            print(json.dumps(result.plan.to_wire(), indent=2))
        else:
            print(json.dumps({"noFit": True, "reasons": result.no_fit_reasons()}, indent=2))
    else:
        shape = profile.shape if profile is not None and profile.shape is not None else None
        source = "from the profile"
        if shape is None:
            try:
                shape, source = shape_from_problem(job.spec.problem), "analytic"
            except ShapeError:
                shape = None
        print(render_result(result, title=plan_title(job, shape, source)))
    if args.chart and result.chosen is not None:
        draw_chart(result, Path(args.chart))
        if not args.json:
            print(f"\nChart: {args.chart}")
    if result.plan is None:
        for reason in result.no_fit_reasons():
            print(f"nofit: {reason}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: Any) -> None:
    """Register `memfit plan` (sets `func`)."""
    p = subparsers.add_parser("plan", help="choose the cheapest configuration and pool that fits (offline)",
                              description=cmd_plan.__doc__)
    p.add_argument("job", help="MemoryOptimizedTrainingJob YAML")
    p.add_argument("--pools", help="GPUNodePool YAML (default: one 8-GPU pool per catalog GPU)")
    p.add_argument("--profile", help="Profile JSON from `memfit-trainer profile`")
    p.add_argument("--json", action="store_true", help="print the Plan as JSON")
    p.add_argument("--chart", help="write a PNG of each candidate's memory breakdown")
    p.set_defaults(func=cmd_plan)

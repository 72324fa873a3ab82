"""A job's first plan per case of benchmarks/planner.py: where the latency tail comes from.

`python benchmarks/planner_per_case.py [--repeats 5]` plans each of the planner benchmark's 15 public
configurations on its 14 pools `repeats` times as a new job (what plans share across calls dropped before
each, the operator's garbage-collector setting) and prints the min and max wall milliseconds per case.
Diagnostic only: it writes no result (the latency figures of record are `planner.py`'s).
"""

from __future__ import annotations

import argparse
import time

import planner as bench
from memfit.catalog import CATALOG
from memfit.cli.cluster import quiet_garbage_collector
from memfit.planner import plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    pools = bench.benchmark_pools()
    cases = [(case[0], bench.case_spec(case[1], case[3], case[4], case[5])) for case in bench.CASES]
    for _, spec in cases:  # imports and process-wide caches outside the timing
        plan(spec, pools=pools, catalog=CATALOG)
    quiet_garbage_collector()
    print(f"{'case':<30} {'min ms':>8} {'max ms':>8}")
    for name, spec in cases:
        times = []
        for _ in range(args.repeats):
            bench._forget_earlier_plans()
            start = time.perf_counter()
            plan(spec, pools=pools, catalog=CATALOG)
            times.append((time.perf_counter() - start) * 1000)
        print(f"{name:<30} {min(times):8.1f} {max(times):8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time `memfit.planner.plan` on the scale benchmark's job and pools (docs/reliability.md, Scale).

    PYTHONPATH=operator:hack:benchmarks python hack/plan_timing.py [--repeat 30]

Prints the median and p90 milliseconds of one plan and the candidates the search evaluated per plan:
warm (the same job planned again, as the operator does for every capacity snapshot and every job of a
sweep: the search context and step-time terms are shared) and cold (a job never planned before).
To compare with another tree, point PYTHONPATH's `operator` at that tree's copy, e.g.
`git archive <commit> operator | tar -x -C /tmp/old` and `PYTHONPATH=/tmp/old/operator:hack:benchmarks`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import scale
from memfit.api.job import MemoryOptimizedTrainingJob
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.planner import plan
from memfit.planner import plan_job as plan_job_module
from memfit.planner import search as search_module
from memfit.timing import step as step_module
from memfit_testbed.reliability import chaos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    docs = [d for d in chaos.default_gpunodepools() if d["metadata"]["name"] in scale.POOLS] + [scale.A10G_POOL]
    pools = [GPUNodePool.model_validate(d) for d in docs]
    spec = MemoryOptimizedTrainingJob.model_validate(chaos.quickstart("timing")).spec
    evaluate = search_module._evaluate
    calls = [0]

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return evaluate(*a, **k)

    search_module._evaluate = counted
    for label, cold in (("warm", False), ("cold", True)):
        for _ in range(3):
            plan(spec, pools=pools, catalog=CATALOG)
        calls[0] = 0
        seconds = []
        for _ in range(args.repeat):
            if cold:
                plan_job_module.CONTEXTS.clear()
                step_module.time_terms.cache_clear()
                step_module.engine_traffic.cache_clear()
            started = time.perf_counter()
            plan(spec, pools=pools, catalog=CATALOG)
            seconds.append(time.perf_counter() - started)
        seconds.sort()
        print(f"{label}: plan p50 {1000 * statistics.median(seconds):.2f} ms, "
              f"p90 {1000 * seconds[int(0.9 * len(seconds))]:.2f} ms, "
              f"{calls[0] / args.repeat:.0f} candidates evaluated per plan ({args.repeat} plans)")

if __name__ == "__main__":
    main()

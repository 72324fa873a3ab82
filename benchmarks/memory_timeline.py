"""What is alive at a training step's peak: the allocations grouped by the op that made them.

    python benchmarks/memory_timeline.py CASE_ID [--depth N] [--window NAME]
    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/memory_timeline.py CASE_ID

CASE_ID is a case of the memory accuracy benchmark (memory_accuracy_cases.py). The case trains for
three steps exactly as the truth worker runs it (memory_accuracy_worker.py); torch.profiler records every
CPU allocation and free with its op stack (the counter the CPU meter reads, all threads accounted). At
the largest allocator total of steps 2-3 (or, with `--window`, inside ops whose name contains NAME,
e.g. `Optimizer.step` or `Backward0`), the live allocations are grouped by their allocating op chain
(`--depth` ops) and printed, largest first. This is how the phase rules of memfit.memory were read
(docs/memory-model.md, "How the phases were checked").
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 2**20


def record(case_id: str) -> tuple[Any, Any]:
    """Run the case's three steps under the profiler; (profile, distributed env)."""
    import torch
    from memfit.api.plan import Plan
    from memfit_trainer import dist as mdist
    from memfit_trainer.meters.cpu import C10Flags
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies import make_runner
    from memfit_trainer.strategies.checkpointing import apply_activation_checkpointing
    from memfit_trainer.strategies.peft import apply_peft
    from memory_accuracy_cases import full_cases
    from torch.profiler import ProfilerActivity, profile, record_function

    case = next((c for c in full_cases() if c.id == case_id), None)
    if case is None:
        raise SystemExit(f"memory_timeline: no case {case_id!r} in memory_accuracy_cases.full_cases()")
    env = mdist.read_dist_env(os.environ)
    device = torch.device("cpu")
    torch.set_num_threads(1)
    mdist.init_distributed(env, device)
    plan = Plan.model_validate(case.plan_wire())
    assert plan.problem is not None
    flags = C10Flags()
    flags.enable()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            problem = build_problem(plan.problem, seed=0)
            apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=device,
                       engine=plan.engine)
            apply_activation_checkpointing(problem, plan.activation_checkpointing)
            runner = make_runner(plan=plan, problem=problem, device=device, world_size=env.world_size)
            mbs = plan.micro_batch_size
            for step in range(1, 4):
                key = BatchKey(seed=0, step=step, sample_start=env.rank * mbs, samples=mbs)
                with record_function(f"memfit::step{step}"):
                    batch = problem.make_batch(key)
                    runner.micro_step(batch, last=True)
                    runner.optimizer_step()
                del batch
    finally:
        flags.restore()
    return prof, env


def live_at_peak(prof: Any, *, depth: int, window: str | None) -> tuple[float, dict[str, tuple[int, int]]]:
    """(peak MiB above the session's start, {op chain: (bytes, allocations)}) at the peak."""
    from memfit_trainer.meters.cpu import event_tree
    from torch._C._profiler import _EventType

    rows: list[tuple[int, int, int, int, tuple[str, ...]]] = []  # time, total, size, ptr, op chain
    marks: dict[str, tuple[int, int]] = {}
    spans: list[tuple[int, int]] = []
    stack = event_tree(prof)
    while stack:
        event = stack.pop()
        if event.name.startswith("memfit::"):
            marks[event.name] = (event.start_time_ns, event.end_time_ns)
        elif window and window in event.name:
            spans.append((event.start_time_ns, event.end_time_ns))
        if event.tag == _EventType.Allocation:
            chain, parent = [], event.parent
            while parent is not None:
                if not parent.name.startswith("memfit::"):
                    chain.append(parent.name)
                parent = parent.parent
            extra = event.extra_fields
            rows.append((event.start_time_ns, int(extra.total_allocated), int(extra.alloc_size), int(extra.ptr),
                         tuple(chain)))
        stack.extend(event.children)
    rows.sort()
    base = rows[0][1] - rows[0][2]
    start, end = marks["memfit::step2"][0], marks["memfit::step3"][1]
    inside = [i for i, r in enumerate(rows) if start <= r[0] <= end
              and (not window or any(a <= r[0] <= b for a, b in spans))]
    peak = max(inside, key=lambda i: rows[i][1])
    live: dict[int, tuple[int, int, int, int, tuple[str, ...]]] = {}
    for row in rows[: peak + 1]:
        if row[2] > 0:
            live[row[3]] = row
        else:
            live.pop(row[3], None)
    groups: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for t, _, size, _, chain in live.values():
        name = " < ".join(chain[:depth]) if chain else "(no op)"
        if t < start:
            name = "[before step 2] " + (chain[-1] if chain else "")
        groups[name][0] += size
        groups[name][1] += 1
    return (rows[peak][1] - base) / MIB, {k: (v[0], v[1]) for k, v in groups.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help="a memory accuracy case id, e.g. gpt-zero1-w1-bf16-none-mbs2-adamw")
    parser.add_argument("--depth", type=int, default=3, help="ops of the allocating chain to group by")
    parser.add_argument("--window", default=None, help="only peaks inside ops whose name contains this")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    prof, env = record(args.case)
    peak, groups = live_at_peak(prof, depth=args.depth, window=args.window)
    print(f"{args.case} rank {env.rank}: peak {peak:.2f} MiB; live allocations by op chain:")
    for name, (size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {size / MIB:9.3f} MiB {count:5d}  {name[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

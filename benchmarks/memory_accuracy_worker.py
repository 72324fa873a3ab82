"""Truth worker of the memory accuracy benchmark: real training steps, allocator-level per-rank peaks.

    python -m torch.distributed.run --nproc-per-node N benchmarks/memory_accuracy_worker.py CASES.json OUT
    python benchmarks/memory_accuracy_worker.py CASES.json OUT          (one rank, no launcher)
    ... CASES.json OUT --device cuda    (benchmarks/gpu_checks.py: CUDA statistics and NVML instead)

CASES.json: [{"id": ..., "plan": <Plan wire JSON>}]. For each case, every rank opens the CPU
allocator meter (memfit_trainer.meters.cpu) before the model is built, builds the problem,
applies checkpointing and the engine exactly as memfit-trainer does (`make_runner`), runs STEPS
optimizer steps with the trainer's per-sample batches, and writes OUT/<id>/rank-<r>.json with each
step's peak. One intra-op thread (the meter's requirement).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

STEPS = 3  # the truth is the peak over steps 2..3 (step 1 allocates the optimizer state lazily)


def run_case(plan_wire: dict[str, Any], env: Any, device: Any) -> dict[str, Any]:
    """Measure one plan on this rank."""
    import torch
    from memfit.api.plan import Plan
    from memfit_trainer.activation_offload import activation_offload_of
    from memfit_trainer.meters import region_meter
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies import make_runner
    from memfit_trainer.strategies.checkpointing import apply_activation_checkpointing
    from memfit_trainer.strategies.peft import apply_peft

    plan = Plan.model_validate(plan_wire)
    assert plan.problem is not None
    started = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    meter = region_meter(device)
    runner: Any = None
    with meter:
        with meter.region("build"):
            problem = build_problem(plan.problem, seed=0)
            apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=device,
                       engine=plan.engine)
            apply_activation_checkpointing(problem, plan.activation_checkpointing)
            runner = make_runner(plan=plan, problem=problem, device=device, world_size=env.world_size)
        mbs = plan.micro_batch_size
        for step in range(1, STEPS + 1):
            key = BatchKey(seed=0, step=step, sample_start=env.rank * mbs, samples=mbs)
            with meter.region(f"step{step}"):
                batch = problem.make_batch(key)
                with meter.region(f"backward{step}"):
                    runner.micro_step(batch, last=True)
                with meter.region(f"optimizer{step}"):
                    runner.optimizer_step()
            del batch
        offload = activation_offload_of(problem.model)
        host_peak = offload.peak_host_bytes if offload is not None else None
        if hasattr(runner, "close"):
            runner.close()
        runner = None
        del problem
        gc.collect()
    regions = meter.results()
    steps = [regions[f"step{s}"] for s in range(1, STEPS + 1)]
    phases = [(regions[f"backward{s}"], regions[f"optimizer{s}"]) for s in range(1, STEPS + 1)]
    return {
        "rank": env.rank,
        "world_size": env.world_size,
        "build_peak_bytes": regions["build"].peak_allocated_bytes,
        "steps": [
            {
                "peak_bytes": r.peak_allocated_bytes,
                "start_bytes": r.start_allocated_bytes,
                "end_bytes": r.end_allocated_bytes,
                "reserved_bytes": r.peak_reserved_bytes,
                "device_bytes": r.peak_device_bytes,
                "seconds": round(r.seconds, 4),
            }
            for r in steps
        ],
        "peak_bytes": max(r.peak_allocated_bytes for r in steps[1:]),
        # forward+backward and optimizer-step peaks of steps 2..3 (which phase the peak is in; DeepSpeed
        # steps inside micro_step at the accumulation boundary, so its step is in the first figure)
        "backward_peak_bytes": max(b.peak_allocated_bytes for b, _ in phases[1:]),
        "optimizer_peak_bytes": max(o.peak_allocated_bytes for _, o in phases[1:]),
        "optimizer_start_bytes": max(o.start_allocated_bytes for _, o in phases[1:]),
        "peak_reserved_bytes": _max_known([r.peak_reserved_bytes for r in steps[1:]]),
        "peak_device_bytes": _max_known([r.peak_device_bytes for r in steps[1:]]),
        "seconds": round(time.perf_counter() - started, 3),
        "host_peak_bytes": host_peak,  # activation offload: the most its host copies held
    }


def _max_known(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def main(argv: list[str]) -> int:
    import torch
    from memfit_trainer import dist as mdist

    cases = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    env = mdist.read_dist_env(os.environ)
    if argv[2:4] == ["--device", "cuda"]:  # "--device cpu" (the default) changes nothing
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    mdist.init_distributed(env, device)
    for case in cases:
        target = out / case["id"]
        target.mkdir(parents=True, exist_ok=True)
        gc.collect()
        mdist.barrier()
        try:
            payload = run_case(case["plan"], env, device)
        except Exception as error:
            payload = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        (target / f"rank-{env.rank}.json").write_text(json.dumps(payload))
        mdist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

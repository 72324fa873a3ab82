"""One training process: load and check the plan, join the group, train, report how it ended."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import torch
from memfit.api.termination import (
    DEVICE_CPU,
    DEVICE_CUDA,
    DEVICE_SIMULATED_CUDA,
    KEY_BUDGET_BYTES,
    MAX_RANK_PEAKS,
)

from memfit_trainer import dist as mdist
from memfit_trainer.file_access import FileAccessError
from memfit_trainer.first_steps import MemoryOverPlan
from memfit_trainer.metrics import ENV_JOB, ENV_METRICS_PORT, TrainerMetrics
from memfit_trainer.plan_check import InvalidPlanError, RuntimeFacts, check_plan, load_plan, refuse_invalid
from memfit_trainer.problems import ProblemError
from memfit_trainer.termination import (
    Reason,
    TerminationMessage,
    exit_code,
    is_host_out_of_memory,
    requested_bytes_from_error,
    termination_path,
    write_termination_message,
)
from memfit_trainer.train import Progress, RunResult, TrainOptions, run_training

log = logging.getLogger("memfit_trainer")


def runtime_facts(world_size: int, device: torch.device) -> RuntimeFacts:
    """What this process can run: world size, CUDA, bf16, DeepSpeed async I/O (checked lazily)."""
    cuda = device.type == "cuda"
    return RuntimeFacts(
        world_size=world_size,
        cuda=cuda,
        bf16_supported=torch.cuda.is_bf16_supported() if cuda else True,
        async_io=True,
    )


def async_io_available() -> bool:
    """DeepSpeed's async_io op (NVMe offload) can be built or loaded here."""
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("AsyncIOBuilder")
        return bool(builder is not None and builder.is_compatible(verbose=False))
    except Exception:
        return False


def _fail(message: TerminationMessage, environ: Mapping[str, str]) -> int:
    write_termination_message(message, termination_path(dict(environ)))
    log.error("%s: %s", message.reason.value, message.message or "")
    return exit_code(message.reason)


def _oom_message(
    error: BaseException, *, reason: Reason, env: mdist.DistEnv, progress: Progress
) -> TerminationMessage:
    meter = progress.meter
    peak = 0
    capacity = None
    reserved = None
    simulated = False
    if meter is not None:
        with contextlib.suppress(Exception):
            meter.end_step()  # fold in the failing step's peak (CPU meter: close the profiler cycle)
        peak = meter.run_peak_bytes
        capacity = meter.capacity_bytes
        reserved = getattr(meter, "run_reserved_peak_bytes", None)
        simulated = meter.name == "simulated-gpu"
    return TerminationMessage(
        reason=reason,
        rank=env.rank,
        step=progress.step,
        peak_bytes=peak,
        requested_bytes=requested_bytes_from_error(error),
        capacity_bytes=capacity,
        resumed_from_step=progress.resumed_from_step,
        memory_meter=meter.name if meter is not None else None,
        reserved_peak_bytes=reserved,
        device=DEVICE_SIMULATED_CUDA if simulated else DEVICE_CUDA if reserved is not None else DEVICE_CPU,
        message=str(error).splitlines()[0][:512] if str(error) else type(error).__name__,
    )


def _over_plan_message(error: MemoryOverPlan, *, env: mdist.DistEnv, progress: Progress) -> TerminationMessage:
    meter = progress.meter
    return TerminationMessage(
        reason=Reason.MEMORY_OVER_PLAN,
        rank=env.rank,
        step=error.step,
        peak_bytes=error.peak_bytes,
        capacity_bytes=meter.capacity_bytes if meter is not None else None,
        resumed_from_step=progress.resumed_from_step,
        memory_meter=meter.name if meter is not None else None,
        message=str(error)[:512],
        extra={KEY_BUDGET_BYTES: error.budget_bytes},
    )


def write_report(result: RunResult, report_dir: Path) -> None:
    """The per-rank run report, report_dir/rank-<r>.json."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"rank-{result.rank}.json").write_text(
        json.dumps(asdict(result), indent=1), encoding="utf-8"
    )


def completed_message(result: RunResult, env: mdist.DistEnv) -> TerminationMessage:
    """The success message (collective calls): peakBytes is the largest peak over all ranks, rankPeaks
    every rank's, reservedPeakBytes the largest CUDA reservation, stepSeconds the slowest rank's mean,
    tokensPerSecond the whole job's rate at that pace (every rank trains its own tokens each step) and
    evalLoss the eval set's loss after the last step (every rank computes the same)."""
    rank_peaks = [int(v) for v in mdist.all_gather_float(float(result.peak_bytes))]
    peak = max(rank_peaks)
    reserved = int(mdist.all_reduce_max(float(result.reserved_peak_bytes or 0)))
    nvml = int(mdist.all_reduce_max(float(result.device_peak_bytes or 0)))
    mean_step = result.mean_step_seconds
    step_seconds = mdist.all_reduce_max(mean_step if mean_step is not None else -1.0)
    return TerminationMessage(
        reason=Reason.COMPLETED,
        rank=env.rank,
        steps=result.steps,
        peak_bytes=peak,
        capacity_bytes=result.capacity_bytes,
        final_loss=round(result.final_loss, 6) if result.final_loss is not None else None,
        eval_loss=round(result.eval_losses[-1][1], 6) if result.eval_losses else None,
        resumed_from_step=result.resumed_from_step,
        memory_meter=result.memory_meter,
        rank_peaks=rank_peaks[:MAX_RANK_PEAKS],
        reserved_peak_bytes=reserved or None,
        device_peak_bytes=nvml or None,
        device=result.device,
        step_seconds=round(step_seconds, 6) if step_seconds >= 0 else None,
        tokens_per_second=_job_tokens_per_second(result, env, step_seconds),
    )


def _job_tokens_per_second(result: RunResult, env: mdist.DistEnv, step_seconds: float) -> float | None:
    if step_seconds <= 0 or result.tokens_per_step <= 0:
        return None
    return round(result.tokens_per_step * env.world_size / step_seconds, 1)


def train_process(plan_path: Path, *, report_dir: Path | None, environ: Mapping[str, str]) -> int:
    """Run one rank to the end; the exit code of termination.py."""
    env = mdist.read_dist_env(environ)
    try:
        plan = load_plan(plan_path)
        device = mdist.select_device(env, environ)
        facts = runtime_facts(env.world_size, device)
        if plan.offload.value == "nvme":
            facts = RuntimeFacts(facts.world_size, facts.cuda, facts.bf16_supported, async_io_available())
        check_plan(plan, facts)
    except InvalidPlanError as error:
        return refuse_invalid(error, rank=env.rank, environ=environ)

    progress = Progress()
    try:
        mdist.init_distributed(env, device)
        metrics = TrainerMetrics(job=environ.get(ENV_JOB, "") or "local", rank=env.rank)
        port = environ.get(ENV_METRICS_PORT, "").strip()
        if port.isdigit():
            metrics.serve(int(port) + env.local_rank)
        options = TrainOptions.from_env(plan, environ)
        result = run_training(
            plan, env=env, device=device, options=options, metrics=metrics, progress=progress
        )
        if report_dir is not None:
            write_report(result, report_dir)
        message = completed_message(result, env)
        if env.local_rank == 0:
            write_termination_message(message, termination_path(dict(environ)))
        log.info(
            "completed %d steps, final loss %s, peak %d bytes",
            result.steps,
            message.final_loss,
            message.peak_bytes,
        )
        return exit_code(Reason.COMPLETED)
    except (ProblemError, FileAccessError) as error:
        return refuse_invalid(error, rank=env.rank, environ=environ)
    except MemoryOverPlan as error:
        return _fail(_over_plan_message(error, env=env, progress=progress), environ)
    except torch.OutOfMemoryError as error:
        reason = Reason.CUDA_OUT_OF_MEMORY
        return _fail(_oom_message(error, reason=reason, env=env, progress=progress), environ)
    except (MemoryError, RuntimeError) as error:
        if not is_host_out_of_memory(error):
            traceback.print_exc(file=sys.stderr)
            return _fail(_error_message(error, env, progress), environ)
        return _fail(
            _oom_message(error, reason=Reason.HOST_OUT_OF_MEMORY, env=env, progress=progress), environ
        )
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        return _fail(_error_message(error, env, progress), environ)


def _error_message(error: BaseException, env: mdist.DistEnv, progress: Progress) -> TerminationMessage:
    return TerminationMessage(
        reason=Reason.TRAINING_ERROR,
        rank=env.rank,
        step=progress.step,
        message=f"{type(error).__name__}: {error}"[:2048],
    )


def configure_logging() -> None:
    """One line per record with the rank."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

"""The training loop: build the problem, apply the plan, accumulate to the global batch, checkpoint, measure."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from memfit.api import pod as contract
from memfit.api.common import Engine, PeftMethod, Precision
from memfit.api.plan import Plan
from memfit.api.termination import DEVICE_SIMULATED_CUDA

from memfit_trainer import dist as mdist
from memfit_trainer.checkpoints import (
    CheckpointMeta,
    find_latest,
    finish_checkpoint,
    keep_from_env,
    load_portable_weights,
    native_resume,
    tag_for,
)
from memfit_trainer.file_access import require_folder
from memfit_trainer.finetune import evaluate, save_model, write_summary
from memfit_trainer.first_steps import FirstStepsCheck
from memfit_trainer.meters import MemorySample, StepMeter, step_meter
from memfit_trainer.metrics import TrainerMetrics
from memfit_trainer.problems import BatchKey, Finetune, TrainingProblem, build_problem
from memfit_trainer.strategies import CHECKPOINT_FORMATS, make_runner
from memfit_trainer.strategies.checkpointing import apply_activation_checkpointing
from memfit_trainer.strategies.peft import (
    apply_peft,
    full_parameters,
    save_adapter,
    save_merged,
    write_eval_loss,
)

ENV_INJECT_OOM_AT_STEP = contract.ENV_INJECT_OOM_AT_STEP
ENV_INJECT_OOM_RANK = contract.ENV_INJECT_OOM_RANK
ENV_INJECT_KILL_AT_STEP = contract.ENV_INJECT_KILL_AT_STEP
ENV_INJECT_KILL_RANK = contract.ENV_INJECT_KILL_RANK
ENV_INJECT_HOLD_AT_STEP = contract.ENV_INJECT_HOLD_AT_STEP
ENV_CHECKPOINT_DIR = contract.ENV_CHECKPOINT_DIR
ENV_SEED = contract.ENV_SEED
ENV_OUTPUT_DIR = contract.ENV_OUTPUT_DIR
ENV_SAVE_MERGED = contract.ENV_SAVE_MERGED

log = logging.getLogger("memfit_trainer")


@dataclass(frozen=True, slots=True)
class TrainOptions:
    """Process-level settings around a plan (from the environment)."""

    seed: int = 0
    checkpoint_dir: Path | None = None
    inject_oom_at_step: int | None = None
    inject_oom_rank: int | None = None
    inject_kill_at_step: int | None = None
    inject_kill_rank: int | None = None  # only this global rank is killed (None: every rank)
    inject_hold_at_step: int | None = None  # every rank stalls here until it is ended (a hung collective)
    keep_checkpoints: int = 2
    first_steps: Mapping[str, str] = field(default_factory=dict)  # the environment of the first-steps check
    output_dir: Path | None = None  # where a LoRA/QLoRA run writes its adapter (else <checkpoints>/adapter)
    save_merged: bool = False  # also write the base with the adapter merged in

    @staticmethod
    def from_env(plan: Plan, environ: Mapping[str, str]) -> TrainOptions:
        """Seed, checkpoint folder (plan.checkpointDir or $MEMFIT_CHECKPOINT_DIR) and fault injection."""
        inject = environ.get(ENV_INJECT_OOM_AT_STEP, "").strip()
        inject_rank = environ.get(ENV_INJECT_OOM_RANK, "").strip()
        kill = environ.get(ENV_INJECT_KILL_AT_STEP, "").strip()
        kill_rank = environ.get(ENV_INJECT_KILL_RANK, "").strip()
        hold = environ.get(ENV_INJECT_HOLD_AT_STEP, "").strip()
        folder = plan.checkpoint_dir or environ.get(ENV_CHECKPOINT_DIR) or None
        return TrainOptions(
            seed=int(environ.get(ENV_SEED, "0") or 0),
            checkpoint_dir=Path(folder) if folder else None,
            inject_oom_at_step=int(inject) if inject.isdigit() else None,
            inject_oom_rank=int(inject_rank) if inject_rank.isdigit() else None,
            inject_kill_at_step=int(kill) if kill.isdigit() else None,
            inject_kill_rank=int(kill_rank) if kill_rank.isdigit() else None,
            inject_hold_at_step=int(hold) if hold.isdigit() else None,
            keep_checkpoints=keep_from_env(dict(environ)),
            first_steps={k: v for k, v in environ.items() if k.startswith("MEMFIT_")},
            output_dir=Path(environ[ENV_OUTPUT_DIR]) if environ.get(ENV_OUTPUT_DIR) else None,
            save_merged=environ.get(ENV_SAVE_MERGED, "") in ("1", "true"),
        )


@dataclass
class Progress:
    """Where the run is, readable when it fails (mutable on purpose: the loop updates it)."""

    step: int = 0
    resumed_from_step: int | None = None
    meter: StepMeter | None = None
    last_loss: float | None = None


@dataclass
class RunResult:
    """What a finished run did (also the per-rank JSON report)."""

    rank: int
    world_size: int
    steps: int
    resumed_from_step: int | None
    resumed_natively: bool | None
    final_loss: float | None
    losses: list[tuple[int, float]] = field(default_factory=list)
    peak_bytes: int = 0
    memory_meter: str = ""
    capacity_bytes: int = 0
    step_memory: list[dict[str, int]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    checkpointed_modules: int = 0
    checkpoints_saved: list[int] = field(default_factory=list)
    first_steps_peak_bytes: int = 0  # the largest rank's device peak over the first steps
    seconds: float = 0.0
    reserved_peak_bytes: int | None = None  # CUDA only: the caching allocator's peak reservation
    device_peak_bytes: int | None = None  # NVML process bytes, where the meter has them
    device: str = "cpu"  # cpu, cuda, or simulated-cuda (memfit_trainer.meters.simulated)
    step_seconds: list[float] = field(default_factory=list)
    adapter_parameters: int = 0
    adapter_dir: str | None = None
    eval_losses: list[tuple[int, float]] = field(default_factory=list)  # spec.data's eval set, by step
    # The job's first eval (before training, on its first attempt), carried across resumes by the checkpoints.
    initial_eval_loss: float | None = None
    initial_eval_step: int | None = None
    tokens_per_step: int = 0  # this rank's tokens per optimizer step (micro-batch x accumulation x tokens)
    model_dir: str | None = None  # where the fine-tuned model was saved (Hugging Face format)

    @property
    def mean_step_seconds(self) -> float | None:
        """Mean seconds per optimizer step after the first (warm-up, lazy init) when there are more."""
        timed = self.step_seconds[1:] or self.step_seconds
        return sum(timed) / len(timed) if timed else None


class SimulatedOutOfMemoryError(torch.OutOfMemoryError):
    """Raised by MEMFIT_INJECT_OOM_AT_STEP to exercise the operator's re-plan loop."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _should_inject(options: TrainOptions, step: int, rank: int) -> bool:
    return options.inject_oom_at_step == step and options.inject_oom_rank in (None, rank)


def run_training(
    plan: Plan,
    *,
    env: mdist.DistEnv,
    device: torch.device,
    options: TrainOptions,
    metrics: TrainerMetrics | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Train `plan` to its max steps (resuming from the newest checkpoint); the process group must exist."""
    assert plan.problem is not None and plan.training is not None
    _require_folders(options, is_main=env.is_main)
    progress = progress if progress is not None else Progress()
    started = time.perf_counter()
    meter = step_meter(device, os.environ)
    progress.meter = meter
    meter.start()  # before the model exists, so the CPU counter sees every tensor
    runner: Any = None
    try:
        resuming = options.checkpoint_dir is not None and find_latest(options.checkpoint_dir) is not None
        finetune = _finetune(plan, options, device, rank=env.rank, world_size=env.world_size, resuming=resuming)
        problem = build_problem(plan.problem, seed=options.seed, finetune=finetune)
        adapters = apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=device,
                              engine=plan.engine)
        recomputed = apply_activation_checkpointing(problem, plan.activation_checkpointing)
        fmt = CHECKPOINT_FORMATS[plan.engine]
        latest = find_latest(options.checkpoint_dir) if options.checkpoint_dir else None
        native = latest is not None and native_resume(latest[1], plan, fmt)
        if latest is not None and not native:
            assert options.checkpoint_dir is not None
            load_portable_weights(problem.model, options.checkpoint_dir, latest[0], latest[1])
        runner = make_runner(plan=plan, problem=problem, device=device, world_size=env.world_size,
                             seed=options.seed)
        start_step = 0
        if latest is not None:
            assert options.checkpoint_dir is not None
            if native:
                runner.load(options.checkpoint_dir, latest[0])
            start_step = latest[1].step
            progress.resumed_from_step = start_step
            progress.last_loss = latest[1].loss
            log.info(
                "resuming at step %d from %s (%s)", start_step, latest[0], "native" if native else "weights"
            )
        result = RunResult(
            rank=env.rank,
            world_size=env.world_size,
            steps=start_step,
            resumed_from_step=progress.resumed_from_step,
            resumed_natively=native if latest is not None else None,
            final_loss=progress.last_loss,
            memory_meter=meter.name,
            capacity_bytes=meter.capacity_bytes,
            checkpointed_modules=recomputed,
            adapter_parameters=adapters,
            initial_eval_loss=latest[1].initial_eval_loss if latest is not None else None,
            initial_eval_step=latest[1].initial_eval_step if latest is not None else None,
        )
        if metrics is not None:
            metrics.set_plan(plan, capacity_bytes=meter.capacity_bytes)
            metrics.set_resumed_from(progress.resumed_from_step)
        setup = meter.end_step()
        result.step_memory.append(_memory_row(0, setup))

        def run_eval(step: int) -> None:
            loss = evaluate(runner, problem, micro_batch=plan.micro_batch_size, precision=plan.precision,
                            device=device)
            if loss is not None:
                result.eval_losses.append((step, loss))
                if result.initial_eval_loss is None:  # a checkpoint without one (older trainer): this attempt's
                    result.initial_eval_loss, result.initial_eval_step = loss, step
                if metrics is not None:
                    metrics.observe_eval(loss=loss)
                if env.is_main:
                    log.info("eval loss %.4f at step %d", loss, step)

        run_eval(start_step)
        _train_steps(plan, runner=runner, problem_tokens=problem.tokens_per_sample, make_batch=problem.make_batch,
                     env=env, device=device, options=options, metrics=metrics, progress=progress,
                     result=result, start_step=start_step, run_eval=run_eval)  # fmt: skip
        if not result.eval_losses or result.eval_losses[-1][0] != result.steps:
            run_eval(result.steps)
        result.facts = runner.facts()
        result.peak_bytes = meter.run_peak_bytes
        result.reserved_peak_bytes = getattr(meter, "run_reserved_peak_bytes", None)
        result.device_peak_bytes = getattr(meter, "run_device_peak_bytes", None)
        result.device = device.type if meter.name != "simulated-gpu" else DEVICE_SIMULATED_CUDA
        folder = options.output_dir or (options.checkpoint_dir / "adapter" if options.checkpoint_dir else None)
        if adapters and plan.adapter is not None and folder is not None:
            _save_peft_outputs(problem, plan, folder, options=options, rank=env.rank, device=device, result=result)
        if options.output_dir is not None and plan.peft == PeftMethod.NONE and plan.problem.huggingface is not None:
            saved = save_model(runner, problem, options.output_dir, rank=env.rank)
            result.model_dir = str(saved) if saved is not None else None
        result.seconds = time.perf_counter() - started
        if options.output_dir is not None and env.is_main:
            write_summary(options.output_dir, _summary(plan, result, problem))
        return result
    finally:
        if runner is not None and hasattr(runner, "close"):
            runner.close()
        runner = None
        gc.collect()
        meter.stop()


def _require_folders(options: TrainOptions, *, is_main: bool) -> None:
    """FileAccessError (InvalidPlan) before any work when this process may not use the checkpoint folder
    (every rank writes there) or the output folder (rank 0 writes there)."""
    if options.checkpoint_dir is not None:
        require_folder(options.checkpoint_dir, role="checkpoint folder")
    if options.output_dir is not None and is_main:
        require_folder(options.output_dir, role="output folder")


def _save_peft_outputs(problem: Any, plan: Plan, folder: Path, *, options: TrainOptions, rank: int,
                       device: torch.device, result: RunResult) -> None:
    """Adapter (and merged model) from rank 0, with every parameter whole (every rank takes part in
    gathering ZeRO-3 partitions), then the eval loss, which every rank computes."""
    assert plan.adapter is not None
    with full_parameters(problem.model):
        if rank == 0:
            result.adapter_dir = str(save_adapter(problem.model, folder, method=plan.peft, adapter=plan.adapter,
                                                  base_model=_base_model_name(plan)))
            if options.save_merged:
                save_merged(problem.model, folder)
    write_eval_loss(problem, plan, folder, seed=options.seed, device=device, write=rank == 0)


def _base_model_name(plan: Plan) -> str:
    problem = plan.problem
    if problem is not None and problem.huggingface is not None:
        return problem.huggingface.name
    return ""


def _finetune(plan: Plan, options: TrainOptions, device: torch.device, *, rank: int = 0, world_size: int = 1,
              resuming: bool = False) -> Finetune | None:
    """Pretrained weights and spec.data for a Hugging Face problem: loaded in fp32 (DDP and FSDP keep fp32
    parameters and compute in 16 bits), or in the 16-bit dtype DeepSpeed trains in (it keeps its own fp32
    master copy), or in bf16 for bf16-pure (the weights train in bf16, no fp32 copy); under ZeRO-3, partitioned while loading; under FSDP on several ranks, read by rank 0 only
    and sent shard by shard (not when resuming: the checkpoint has the weights, read the usual way)."""
    assert plan.problem is not None and plan.training is not None
    if plan.problem.huggingface is None:
        return None
    dtype = torch.float32
    if plan.engine == Engine.DEEPSPEED and plan.precision in (Precision.BF16, Precision.FP16):
        dtype = torch.bfloat16 if plan.precision == Precision.BF16 else torch.float16
    if plan.precision == Precision.BF16_PURE:
        dtype = torch.bfloat16
    zero3 = None
    if plan.engine == Engine.DEEPSPEED and plan.zero_stage == 3 and plan.peft == PeftMethod.NONE:
        from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config

        zero3 = build_deepspeed_config(plan, cuda=device.type == "cuda")
    rank0 = plan.engine == Engine.FSDP and world_size > 1 and plan.peft == PeftMethod.NONE and not resuming
    return Finetune(data=plan.data, seed=options.seed, global_batch_size=plan.training.global_batch_size,
                    dtype=dtype, zero3_config=zero3, environ=dict(os.environ), load_on_rank0=rank0, rank=rank)


def _summary(plan: Plan, result: RunResult, problem: TrainingProblem) -> dict[str, Any]:
    """The training summary written beside the model."""
    assert plan.problem is not None and plan.training is not None
    data = plan.data
    return {
        "model": _base_model_name(plan),
        "configuration": plan.describe(),
        "world_size": result.world_size,
        "steps": result.steps,
        "max_steps": plan.training.max_steps,
        "global_batch_size": plan.training.global_batch_size,
        "sequence_length": problem.tokens_per_sample,
        "resumed_from_step": result.resumed_from_step,
        "losses": result.losses,
        "final_loss": result.final_loss,
        "eval_losses": result.eval_losses,
        "initial_eval_loss": result.initial_eval_loss,
        "initial_eval_step": result.initial_eval_step,
        "final_eval_loss": result.eval_losses[-1][1] if result.eval_losses else None,
        "data": data.to_wire() if data is not None else {"synthetic": True},
        "seconds": round(result.seconds, 3),
        "model_dir": result.model_dir,
        "adapter_dir": result.adapter_dir,
    }


def _memory_row(step: int, sample: MemorySample) -> dict[str, int]:
    return {
        "step": step,
        "allocated_bytes": sample.allocated_bytes,
        "reserved_bytes": sample.reserved_bytes,
        "peak_bytes": sample.peak_bytes,
        "transient_peak_bytes": sample.transient_peak_bytes,
    }


def _train_steps(
    plan: Plan,
    *,
    runner: Any,
    problem_tokens: int,
    make_batch: Any,
    env: mdist.DistEnv,
    device: torch.device,
    options: TrainOptions,
    metrics: TrainerMetrics | None,
    progress: Progress,
    result: RunResult,
    start_step: int,
    run_eval: Any = None,
) -> None:
    assert plan.training is not None and progress.meter is not None
    eval_every = plan.data.eval_every_steps if plan.data is not None else 0
    training = plan.training
    accumulation = plan.gradient_accumulation_steps
    micro = plan.micro_batch_size
    every = plan.checkpoint_interval_steps  # the job's pinned everySteps, else the plan's choice
    check = FirstStepsCheck.for_plan(plan, environ=options.first_steps)
    for step in range(start_step + 1, training.max_steps + 1):
        progress.step = step
        began = time.perf_counter()
        losses = []
        for index in range(accumulation):
            key = BatchKey(
                seed=options.seed,
                step=step,
                sample_start=(index * env.world_size + env.rank) * micro,
                samples=micro,
            )
            if index == 0 and options.inject_kill_at_step == step and options.inject_kill_rank in (None, env.rank):
                # Simulates a lost node or pre-emption: no message, no cleanup (MEMFIT_INJECT_KILL_AT_STEP).
                os.kill(os.getpid(), signal.SIGKILL)
            if index == 0 and options.inject_hold_at_step == step:
                log.warning("holding at step %d until this process is ended (%s)", step, ENV_INJECT_HOLD_AT_STEP)
                while True:  # a stalled rank: only a signal ends it
                    time.sleep(1)
            losses.append(runner.micro_step(make_batch(key), last=index == accumulation - 1))
            if index == 0 and _should_inject(options, step, env.rank):
                raise SimulatedOutOfMemoryError(
                    f"CUDA out of memory (simulated by {ENV_INJECT_OOM_AT_STEP}={step} on rank {env.rank})"
                )
        runner.optimizer_step()
        loss = mdist.all_reduce_mean(float(torch.stack(losses).float().mean()))
        _sync(device)
        seconds = time.perf_counter() - began
        sample = progress.meter.end_step()
        progress.last_loss = loss
        result.steps = step
        result.final_loss = loss
        result.losses.append((step, loss))
        result.step_memory.append(_memory_row(step, sample))
        result.step_seconds.append(seconds)
        samples = micro * accumulation
        result.tokens_per_step = samples * problem_tokens
        if metrics is not None:
            metrics.observe_step(step=step, seconds=seconds, samples=samples, tokens=samples * problem_tokens,
                                 loss=loss, memory=sample, run_peak_bytes=progress.meter.run_peak_bytes)  # fmt: skip
        if env.is_main:
            log.info(
                "step %d/%d loss %.4f %.3fs peak %.1f MiB",
                step, training.max_steps, loss, seconds, sample.peak_bytes / 2**20,
            )  # fmt: skip
        if run_eval is not None and eval_every and step % eval_every == 0:
            run_eval(step)
        saved = options.checkpoint_dir is not None and (step % every == 0 or step == training.max_steps)
        if saved:
            _save(plan, runner=runner, options=options, step=step, loss=loss, env=env, result=result)
            result.checkpoints_saved.append(step)
        if check is not None and check.checks(step, start_step=start_step):
            # Every rank takes part (a collective): the largest rank's peak decides for all of them.
            peak = int(mdist.all_reduce_max(float(check.measured(progress.meter.device_peak_bytes()))))
            result.first_steps_peak_bytes = max(result.first_steps_peak_bytes, peak)
            over = check.verdict(step, peak)
            if over is not None:
                if options.checkpoint_dir is not None and not saved:  # the re-planned attempt resumes here
                    _save(plan, runner=runner, options=options, step=step, loss=loss, env=env, result=result)
                    result.checkpoints_saved.append(step)
                raise over


def _save(
    plan: Plan, *, runner: Any, options: TrainOptions, step: int, loss: float, env: mdist.DistEnv, result: RunResult
) -> None:
    assert options.checkpoint_dir is not None
    directory = options.checkpoint_dir
    tag = tag_for(step)
    if env.is_main:
        directory.mkdir(parents=True, exist_ok=True)
    mdist.barrier()
    runner.save(directory, tag)
    mdist.barrier()
    if env.is_main:
        meta = CheckpointMeta.for_plan(
            plan=plan, step=step, fmt=runner.checkpoint_format, loss=loss, seed=options.seed,
            initial_eval=(result.initial_eval_step, result.initial_eval_loss),
        )
        finish_checkpoint(directory, tag, meta, keep=options.keep_checkpoints)
    mdist.barrier()

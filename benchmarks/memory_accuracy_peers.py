"""Predictors compared by the memory accuracy benchmark: memfit and its peers, on the same cases.

Each predictor returns bytes per rank, or None where it cannot handle the case:

- memfit: `memfit.memory` calibrated from a Profile of the same problem (as the operator plans), and
  memfit-analytic, the same model with no profile (the planner's fallback).
- deepspeed: `estimate_zero2_model_states_mem_needs` (ZeRO 0-2; stage 0 unsharded) and
  `estimate_zero3_model_states_mem_needs` (ZeRO-3), the return-value variants, GPU bytes; DeepSpeed
  cases only.
- accelerate: `estimate_training_usage` on the size `calculate_maximum_sizes` gives for a meta model
  (the library calls of `accelerate estimate-memory`),
  peak = the largest of its entries (what `accelerate estimate-memory` prints); single-rank,
  32-bit Adam(W) cases.
- memtracker: torch.distributed._tools MemTracker (single-rank DDP cases, model traced bare) or
  FSDPMemTracker on a fake process group (FSDP cases) under FakeTensorMode; not DeepSpeed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.api.common import Checkpointing, Engine, Offload, OptimizerImplementation, PeftMethod, Precision
from memfit.api.job import OptimizerKind
from memfit.api.problem import Problem
from memfit.api.profile import Profile
from memory_accuracy_cases import PROBLEMS, Case

MEMFIT_TIMING_REPEATS = 200
# Where the truth runs: memfit is asked about that device (its optimizer-step rules differ between CPU
# and CUDA). benchmarks/gpu_checks.py sets "cuda".
TRUTH_DEVICE = "cpu"


@dataclass(frozen=True, slots=True)
class Prediction:
    """Bytes per rank (None: the predictor cannot handle the case) and seconds to produce it."""

    bytes: int | None
    seconds: float
    detail: dict[str, Any] | None = None


def _strategy(case: Case) -> Any:
    from memfit.api.training_config import TrainingConfig
    from memfit.memory import Device, Strategy

    config = TrainingConfig(
        engine=Engine(case.engine),
        zero_stage=case.zero_stage,
        precision=Precision(case.precision),
        activation_checkpointing=Checkpointing(case.checkpointing),
        offload=Offload(case.offload),
        optimizer8bit=case.eight_bit,
        micro_batch_size=case.micro_batch_size,
        gradient_accumulation_steps=1,
        peft=PeftMethod(case.peft),
        optimizer_in_backward=case.in_backward,
        chunked_loss=case.chunked,
        activation_offload=case.act_offload,
        optimizer_implementation=OptimizerImplementation(case.implementation) if case.implementation else None,
    )
    layout = None
    if case.peft != "none":  # the adapters' layout, from the plan the truth worker ran
        from memfit.api.plan import Plan
        from memfit.memory.adapter import adapter_layout

        plan = Plan.model_validate(case.plan_wire())
        assert plan.adapter is not None
        layout = adapter_layout(PROBLEMS[case.family], plan.adapter)
    # The predictor is asked about the device the case ran on.
    return Strategy(config=config, optimizer=OptimizerKind(case.optimizer), world_size=case.world_size,
                    gpus_per_node=case.world_size, device=Device(TRUTH_DEVICE), adapter=layout)


def memfit_predictor(profile: Profile) -> Callable[[Case], Prediction]:
    """memfit calibrated from `profile` (the operator's path: calibrate once, then arithmetic)."""
    from memfit.memory import Shape, calibrate, predict_memory

    assert profile.shape is not None
    shape = Shape.of(profile.shape)
    calibration = calibrate(profile, shape)  # with the optimizer the profile ran

    def predict(case: Case) -> Prediction:
        strategy = _strategy(case)
        started = time.perf_counter()
        for _ in range(MEMFIT_TIMING_REPEATS):
            estimate = predict_memory(shape, strategy, calibration=calibration)
        seconds = (time.perf_counter() - started) / MEMFIT_TIMING_REPEATS
        # CPU truth is allocated bytes: no CUDA context, NCCL or caching-allocator fragmentation.
        return Prediction(estimate.allocated_bytes, seconds, _breakdown(estimate))

    return predict


def _breakdown(estimate: Any) -> dict[str, Any]:
    """The predicted peak's phase and components (allocated bytes), for diagnosing errors."""
    names = (
        "parameters_bytes",
        "gradients_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "temporaries_bytes",
    )
    return {"phase": estimate.phase, **{n: getattr(estimate, n) for n in names}, "host_bytes": estimate.host_bytes}


def memfit_analytic(case: Case) -> Prediction:
    """memfit without a profile: the analytic shape of the problem, no calibration."""
    from memfit.memory import predict_memory, shape_from_problem

    started = time.perf_counter()
    shape = shape_from_problem(Problem.model_validate(PROBLEMS[case.family]))
    estimate = predict_memory(shape, _strategy(case))
    return Prediction(estimate.allocated_bytes, time.perf_counter() - started, _breakdown(estimate))


@functools.cache
def _meta_counts(family: str) -> tuple[int, int, int]:
    """(parameters, largest layer's parameters, fp32 bytes per accelerate) of the problem's meta model.

    Computed once per problem and not timed, as memfit's profile is not: peers and memfit alike are
    timed for a new configuration of a known problem.
    """
    import torch
    from accelerate.utils import calculate_maximum_sizes
    from memfit_trainer.problems import build_problem

    with torch.device("meta"):
        model = build_problem(Problem.model_validate(PROBLEMS[family])).model
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    total_bytes, _ = calculate_maximum_sizes(model)
    return params, largest, int(total_bytes)


def deepspeed_states(case: Case) -> Prediction:
    """DeepSpeed's model-state estimators (GPU bytes), for DeepSpeed cases."""
    if case.engine != "deepspeed":
        return Prediction(None, 0.0)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    params, largest, _ = _meta_counts(case.family)
    started = time.perf_counter()
    gpus = case.world_size if case.zero_stage >= 1 else 1  # stage 0 partitions nothing
    if case.zero_stage == 3:
        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            params, largest, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False, cpu_offload_params=False
        )
    else:
        _, gpu = estimate_zero2_model_states_mem_needs(
            params, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False
        )
    return Prediction(int(gpu), time.perf_counter() - started)


def accelerate_estimate(case: Case) -> Prediction:
    """accelerate's estimate-memory as a library on a meta model: single rank, 32-bit Adam(W)."""
    if case.world_size != 1 or case.engine != "ddp" or case.eight_bit or case.optimizer == "sgd":
        return Prediction(None, 0.0)
    from accelerate.commands.estimate import estimate_training_usage

    _, _, total_bytes = _meta_counts(case.family)
    started = time.perf_counter()
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[case.precision]
    usage = estimate_training_usage(total_bytes, dtype)
    return Prediction(int(max(usage.values())), time.perf_counter() - started)


def memtracker(case: Case) -> Prediction:
    """MemTracker (single-rank DDP cases) or FSDPMemTracker (FSDP) under FakeTensorMode."""
    if case.engine == "deepspeed":
        return Prediction(None, 0.0)
    from memfit_trainer.profiler.fake import FakeConfig, fake_peak

    config = FakeConfig(
        precision=Precision(case.precision),
        checkpointing=Checkpointing(case.checkpointing),
        micro_batch_size=case.micro_batch_size,
        optimizer=OptimizerKind(case.optimizer),
        optimizer8bit=case.eight_bit,
        fsdp_world_size=case.world_size if case.engine == "fsdp" else 0,
        fsdp_reshard_after_forward=case.zero_stage == 3,
    )
    try:
        estimate = fake_peak(Problem.model_validate(PROBLEMS[case.family]), config)
    except Exception as error:  # a configuration the tracer cannot trace: reported as not handled
        print(f"memtracker: {case.id}: {type(error).__name__}: {error}")
        return Prediction(None, 0.0)
    return Prediction(estimate.peak_bytes, estimate.seconds)


PEERS: dict[str, Callable[[Case], Prediction]] = {
    "memfit-analytic": memfit_analytic,
    "deepspeed": deepspeed_states,
    "accelerate": accelerate_estimate,
    "memtracker": memtracker,
}

"""The profile's LoRA/QLoRA variant as a correction: each measured point (bf16, no checkpointing, the
job's adapters, the bare model on the profiling device) against the analytic PEFT prediction of the
same configuration; the largest shortfall is a fixed residual added to PEFT strategies that run like
the profile (DDP on that device) -- only ever raising the prediction, as borrowed corrections do in
calibration.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memfit.api.common import Checkpointing, PeftMethod, Precision
from memfit.api.job import OptimizerKind
from memfit.memory.strategy import Device, Strategy

PeftPoint = tuple[PeftMethod, Precision, Checkpointing, int, int]


def peft_fixed_residual(points: Sequence[PeftPoint], strategy: Strategy, *, device: Device,
                        optimizer: OptimizerKind | None, allocated: Callable[[Strategy, int], float]) -> float:
    """Bytes the analytic model misses for `strategy`'s method at the measured points (>= 0): each point
    is predicted as it ran (bare model, world size 1, 32-bit `optimizer`, on `device`) with the
    strategy's adapters -- the profile measured the job's own (the profile cache key covers them).

    `allocated(strategy, micro_batch)` is the uncorrected prediction of allocated bytes."""
    shortfall = 0.0
    for method, precision, checkpointing, micro_batch, peak in points:
        if method != strategy.config.peft:
            continue
        profiled = strategy.with_config(precision=precision, activation_checkpointing=checkpointing,
                                        micro_batch_size=micro_batch, gradient_accumulation_steps=1,
                                        optimizer8bit=False)
        profiled = Strategy(config=profiled.config, optimizer=optimizer or strategy.optimizer, world_size=1,
                            gpus_per_node=1, device=device, adapter=strategy.adapter)
        shortfall = max(shortfall, peak - allocated(profiled, micro_batch))
    return shortfall

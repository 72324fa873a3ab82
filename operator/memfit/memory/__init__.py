"""PURE memory model: model shape + strategy (+ profile calibration) -> per-GPU peak and step time.

No torch, kopf or Kubernetes imports. The planner calls `memory_terms` / `time_terms` thousands of
times; one-off callers use `predict_memory` and `estimate_step_seconds`.
"""

from __future__ import annotations

from memfit.memory.calibration import Calibration, calibrate
from memfit.memory.predict import MemoryEstimate, MemoryTerms, memory_terms, predict_memory
from memfit.memory.problems import ShapeError, shape_from_hf_config, shape_from_problem
from memfit.memory.shape import Shape
from memfit.memory.states import zero_model_state_bytes
from memfit.memory.strategy import Device, Strategy, strategy_from_pins, strategy_problem
from memfit.memory.timing import (
    GpuSpeed,
    StepTime,
    TimeTerms,
    estimate_step_seconds,
    flops_per_sample,
    time_terms,
)

__all__ = [
    "Calibration",
    "Device",
    "GpuSpeed",
    "MemoryEstimate",
    "MemoryTerms",
    "Shape",
    "ShapeError",
    "StepTime",
    "Strategy",
    "TimeTerms",
    "calibrate",
    "estimate_step_seconds",
    "flops_per_sample",
    "memory_terms",
    "predict_memory",
    "shape_from_hf_config",
    "shape_from_problem",
    "strategy_from_pins",
    "strategy_problem",
    "time_terms",
    "zero_model_state_bytes",
]

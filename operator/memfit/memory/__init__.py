"""PURE memory model: model shape + strategy (+ profile calibration) -> per-GPU peak (the step time is
`memfit.timing`).

No torch, kopf or Kubernetes imports. The planner calls `memory_terms` thousands of times; one-off
callers use `predict_memory`.
"""

from __future__ import annotations

from memfit.memory.calibration import Calibration, calibrate
from memfit.memory.predict import MemoryEstimate, MemoryTerms, memory_terms, predict_memory
from memfit.memory.problems import ShapeError, shape_from_hf_config, shape_from_problem
from memfit.memory.shape import Shape
from memfit.memory.states import zero_model_state_bytes
from memfit.memory.strategy import Device, Strategy, strategy_from_pins, strategy_problem

__all__ = [
    "Calibration",
    "Device",
    "MemoryEstimate",
    "MemoryTerms",
    "Shape",
    "ShapeError",
    "Strategy",
    "calibrate",
    "memory_terms",
    "predict_memory",
    "shape_from_hf_config",
    "shape_from_problem",
    "strategy_from_pins",
    "strategy_problem",
    "zero_model_state_bytes",
]

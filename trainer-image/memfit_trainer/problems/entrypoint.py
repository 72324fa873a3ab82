"""User problems: `module.path:function` in the image, called without arguments."""

from __future__ import annotations

import importlib

from memfit_trainer.problems.base import TrainingProblem
from memfit_trainer.problems.errors import ProblemError


def load_entrypoint(entrypoint: str) -> TrainingProblem:
    """Import `module:function`, call it and check that it returned a TrainingProblem."""
    module_name, sep, attribute = entrypoint.partition(":")
    if not sep or not module_name or not attribute:
        raise ProblemError(f"problem.entrypoint {entrypoint!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProblemError(
            f"problem.entrypoint {entrypoint!r}: cannot import {module_name!r}: {exc}"
        ) from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ProblemError(f"problem.entrypoint {entrypoint!r}: {module_name} has no callable {attribute!r}")
    try:
        problem = factory()
    except MemoryError:
        raise
    except Exception as exc:
        raise ProblemError(f"problem.entrypoint {entrypoint!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(problem, TrainingProblem):
        raise ProblemError(
            f"problem.entrypoint {entrypoint!r} returned {type(problem).__name__}; "
            "it must return memfit_trainer.problems.TrainingProblem"
        )
    return problem

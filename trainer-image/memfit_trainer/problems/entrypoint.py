"""User problems: `module.path:function` in the image, called without arguments."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from memfit_trainer.problems.base import BatchKey, TrainingProblem
from memfit_trainer.problems.errors import DepthNotSupported, ProblemError


def accepts_depth(factory: Callable[..., Any]) -> bool:
    """True when the entrypoint function takes a `depth` argument (or **kwargs)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "depth" or p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def load_entrypoint(entrypoint: str, *, depth: int | None = None, check: bool = True) -> TrainingProblem:
    """Import `module:function`, call it (with `depth=` when given) and check that it returned a
    TrainingProblem."""
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
    if depth is not None and not accepts_depth(factory):
        raise DepthNotSupported(
            f"problem.entrypoint {entrypoint!r}: the function takes no `depth` argument, so its model "
            "cannot be built with fewer blocks. To fix: add `depth: int | None = None` and build that many blocks"
        )
    try:
        problem = factory() if depth is None else factory(depth=depth)
    except MemoryError:
        raise
    except Exception as exc:
        raise ProblemError(f"problem.entrypoint {entrypoint!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(problem, TrainingProblem):
        raise ProblemError(
            f"problem.entrypoint {entrypoint!r} returned {type(problem).__name__}; "
            "it must return memfit_trainer.problems.TrainingProblem"
        )
    if check:
        check_problem(problem, where=f"problem.entrypoint {entrypoint!r}")
    return problem


def check_problem(problem: TrainingProblem, *, where: str) -> None:
    """The contract a plan relies on: blocks are the model's submodules, batches are deterministic.

    Checkpointing and FSDP wrap `blocks` inside the model: a block that is not a submodule would be
    wrapped but never run (or run outside the model's parameters). The trainer and the profiler draw
    the same samples by key on every rank and every attempt, so `make_batch` must be a function of
    its key.
    """
    modules = {id(m) for m in problem.model.modules()}
    for index, block in enumerate(problem.blocks):
        if id(block) not in modules:
            raise ProblemError(f"{where}: blocks[{index}] ({type(block).__name__}) is not a submodule of the model")
    key = BatchKey(seed=0, step=1, sample_start=0, samples=2)
    try:
        first, second = problem.make_batch(key), problem.make_batch(key)
    except MemoryError:
        raise
    except Exception as exc:
        raise ProblemError(f"{where}: make_batch raised {type(exc).__name__}: {exc}") from exc
    if set(first) != set(second):
        raise ProblemError(f"{where}: make_batch is not deterministic in its key: "
                           f"keys {sorted(first)} then {sorted(second)}")
    for name in sorted(first):
        a, b = first[name], second[name]
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            raise ProblemError(f"{where}: make_batch()[{name!r}] is {type(a).__name__}, not a tensor")
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            raise ProblemError(f"{where}: make_batch is not deterministic in its key: {name!r} differs "
                               "between two calls with the same BatchKey (seed the generator from key.sample_seeds())")

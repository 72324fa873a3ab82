"""Depth-reduced profiles: find a model's repeated blocks structurally and count the full model on `meta`.

A large model is never built whole on a real device. Its full-depth version is built on the meta
device (no storage: parameter counts and the block structure only); the measured models are the same
architecture with 1 and 2 of its L blocks (real width, heads, vocabulary, sequence length, dtype).
`memfit.memory` separates each measured term into a per-block and a fixed part from the two depths and
scales the per-block part to L (memfit/memory/depth.py).

The repeated blocks are found the same way for every model: the longest `nn.ModuleList` (or
`nn.Sequential`) whose children all have the same structure (module type, parameter names, shapes and
dtypes). A reduced model must contain such a list with exactly the requested number of blocks, of the
same structure as the full model's blocks; otherwise the depth knob did not do what it says (an
entrypoint that ignores `depth`) and profiling stops with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from memfit.api.problem import Problem
from torch import nn

from memfit_trainer.problems import ProblemError, TrainingProblem, build_problem
from memfit_trainer.profiler.errors import DepthUnavailable, ProfileInputError

# Depths measured: two points separate the per-block from the fixed terms of every measured quantity.
REDUCED_DEPTHS = (1, 2)

Signature = tuple[str, tuple[tuple[str, tuple[int, ...], str], ...]]


def block_signature(block: nn.Module) -> Signature:
    """What makes two blocks the same: module type and every parameter's name, shape and dtype."""
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in block.named_parameters())
    return type(block).__name__, params


def find_repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The longest list of identical-structure blocks in the model (ties: the most parameters);
    empty when the model has none with parameters."""
    best: list[nn.Module] = []
    best_key = (0, 0)
    for module in model.modules():
        if not isinstance(module, nn.ModuleList | nn.Sequential):
            continue
        children = list(module.children())
        if not children or not any(True for _ in children[0].parameters()):
            continue
        first = block_signature(children[0])
        if any(block_signature(c) != first for c in children[1:]):
            continue
        key = (len(children), sum(p.numel() for p in children[0].parameters()))
        if key > best_key:
            best, best_key = children, key
    return best


def reduced_depths(layers: int) -> tuple[int, ...]:
    """The depths to measure for a model of `layers` blocks; () when reducing would not save anything."""
    return tuple(d for d in REDUCED_DEPTHS if d < layers) if layers > max(REDUCED_DEPTHS) else ()


def build_full_on_meta(spec: Problem, *, seed: int) -> tuple[TrainingProblem, list[nn.Module]]:
    """The full-depth problem on the meta device (no storage) and its repeated blocks (empty: none).

    Raises ProfileInputError when the problem cannot be built there."""
    try:
        with torch.device("meta"):
            problem = build_problem(spec, seed=seed, check=False)
    except ProblemError as exc:
        raise ProfileInputError("problem", str(exc)) from exc
    except Exception as exc:  # user code or a library that cannot build on meta
        raise ProfileInputError(
            "problem", f"cannot build the full model on the meta device for a depth-reduced profile: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return problem, find_repeated_blocks(problem.model)


def check_reduced(problem: TrainingProblem, *, depth: int, full_block: Signature, where: str) -> None:
    """The reduced model must hold `depth` blocks of the full model's block structure."""
    blocks = find_repeated_blocks(problem.model)
    if len(blocks) != depth or block_signature(blocks[0]) != full_block:
        found = f"{len(blocks)} block(s) of {block_signature(blocks[0])[0]}" if blocks else "no repeated blocks"
        raise DepthUnavailable(
            f"{where}: asked for a model with {depth} of its blocks, the built model has {found} "
            f"(expected {full_block[0]}): it ignores `depth`"
        )


def extrapolate(values: Sequence[tuple[int, float]], layers: int) -> float:
    """The line through (depth, value) points, read at `layers` (a least-squares line for more than two)."""
    if len(values) == 1:
        return values[0][1]
    xs = [float(d) for d, _ in values]
    ys = [v for _, v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return my + slope * (layers - mx)

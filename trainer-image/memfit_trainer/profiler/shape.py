"""The ModelShape of a built problem: counted from the real model, dimensions from the spec or the modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.api.problem import Problem
from memfit.api.profile import ModelShape
from torch import nn

from memfit_trainer.problems import TrainingProblem

HEAD_ATTRIBUTES = ("num_heads", "heads", "n_head", "num_attention_heads", "n_heads")


@dataclass(frozen=True, slots=True)
class ParameterCounts:
    """What counting the model's tensors gives (these override any analytic count)."""

    parameters: int
    trainable_parameters: int
    largest_layer_parameters: int
    buffer_bytes: int
    small_parameters: int = 0  # trainable, in tensors under 4096 elements (bitsandbytes min_8bit_size)


def count_parameters(model: nn.Module) -> ParameterCounts:
    """Parameters (shared ones once), trainable ones, the largest module's own parameters, buffer bytes."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    small = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()
                if p.requires_grad and p.numel() < 4096)
    return ParameterCounts(total, trainable, largest, buffers, small)


def model_shape(spec: Problem, problem: TrainingProblem) -> ModelShape:
    """The shape the predictor needs: analytic dimensions where the spec gives them, counts measured."""
    counts = count_parameters(problem.model)
    update: dict[str, Any] = {
        "parameters": counts.parameters,
        "trainable_parameters": counts.trainable_parameters
        if counts.trainable_parameters != counts.parameters
        else None,
        "largest_layer_parameters": counts.largest_layer_parameters,
        "buffer_bytes": counts.buffer_bytes,
    }
    analytic = _analytic_shape(spec)
    if analytic is not None:
        return analytic.model_copy(update=update)
    return ModelShape(**update, small_parameters=counts.small_parameters, **_introspect(problem))


def _analytic_shape(spec: Problem) -> ModelShape | None:
    try:
        from memfit.memory.problems import shape_from_problem
    except ImportError:  # older operator package: fall back to looking at the modules
        return None
    try:
        return shape_from_problem(spec)
    except ValueError:  # entrypoints and configs the analytic model does not cover
        return None


def _introspect(problem: TrainingProblem) -> dict[str, Any]:
    """Dimensions of user models from their modules: best effort, for the analytic parts of a plan."""
    model, blocks = problem.model, problem.blocks
    first = blocks[0] if blocks else model
    linears = [m for m in first.modules() if isinstance(m, nn.Linear)]
    hidden = _hidden(first, linears)
    up = [
        m.out_features
        for m in linears
        if m.in_features == hidden and m.out_features not in (hidden, 3 * hidden)
    ]
    ffn = max(up, default=4 * hidden)
    gated = sum(1 for m in linears if m.in_features == hidden and m.out_features == ffn) >= 2
    block_ids = {id(m) for b in blocks for m in b.modules()}
    outside = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in block_ids]
    vocab = max((m.out_features for m in outside if m.in_features == hidden), default=0)
    vision = any(isinstance(m, nn.Conv2d) for m in model.modules())
    seq2seq = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
    return {
        "family": "vision" if vision else ("encoder-decoder" if seq2seq else "decoder"),
        "layers": max(1, len(blocks)),
        "hidden": hidden,
        "heads": _heads(first, hidden),
        "ffn_hidden": ffn,
        "vocab": 0 if vision else vocab,
        "tokens_per_sample": max(1, problem.tokens_per_sample),
        "gated_mlp": gated,
    }


def _hidden(block: nn.Module, linears: list[nn.Linear]) -> int:
    for m in block.modules():
        shape = getattr(m, "normalized_shape", None)
        if shape:
            return int(shape[-1])
        weight = getattr(m, "weight", None)
        if type(m).__name__.endswith("RMSNorm") and weight is not None and weight.dim() == 1:
            return int(weight.shape[0])
    return linears[0].in_features if linears else 1


def _heads(block: nn.Module, hidden: int) -> int:
    for m in block.modules():
        for name in HEAD_ATTRIBUTES:
            value = getattr(m, name, None)
            if isinstance(value, int) and value > 0 and hidden % value == 0:
                return value
        config = getattr(m, "config", None)
        value = getattr(config, "num_attention_heads", None)
        if isinstance(value, int) and value > 0:
            return value
    return 1

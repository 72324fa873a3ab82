"""Hugging Face models from a config (random weights): `AutoConfig.for_model` on the inline config."""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.nn.functional as F
from memfit.api.problem import HuggingFaceProblem
from torch import nn

from memfit_trainer.problems.base import Batch, BatchKey, TrainingProblem
from memfit_trainer.problems.data import token_batch
from memfit_trainer.problems.errors import DepthNotSupported, ProblemError


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise ProblemError(
            "problem.huggingface needs the `transformers` package, which is not installed in this image. "
            "To fix: use a trainer image with transformers (pip install transformers), or a builtin problem."
        ) from exc


def _config(spec: HuggingFaceProblem, transformers: Any) -> Any:
    if spec.config is None:
        # Downloads config.json only (no weights); needs network access from the pod.
        return transformers.AutoConfig.from_pretrained(spec.model)
    values = dict(spec.config)
    model_type = values.pop("model_type", None)
    if not isinstance(model_type, str):
        raise ProblemError(
            f"problem.huggingface.config for {spec.model!r} has no string `model_type` "
            '(e.g. "llama"); it is needed to pick the config class.'
        )
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except (ValueError, KeyError) as exc:
        raise ProblemError(f"problem.huggingface.config: unknown model_type {model_type!r}: {exc}") from exc


def _reduce_depth(config: Any, depth: int, model: str) -> None:
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int):
        raise DepthNotSupported(f"problem.huggingface: config of {model!r} has no num_hidden_layers; "
                           "its depth cannot be reduced")
    if depth > layers:
        raise DepthNotSupported(f"problem.huggingface: depth {depth} is larger than the model's {layers} layers")
    config.num_hidden_layers = depth
    for name, value in list(vars(config).items()):
        # Per-layer settings (e.g. `layer_types`) must have one entry per remaining layer.
        if isinstance(value, list) and len(value) == layers and layers > 1 and name != "architectures":
            setattr(config, name, value[:depth])


def _largest_module_list(model: nn.Module) -> list[nn.Module]:
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return []
    return list(max(lists, key=len))


def _logits_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())


def _hidden_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Models without an LM head: regress the last hidden state to zero (a synthetic, differentiable task).
    return model(input_ids=batch["input_ids"]).last_hidden_state.float().pow(2).mean()


def build_huggingface(spec: HuggingFaceProblem, *, depth: int | None = None) -> TrainingProblem:
    """A transformers model with random weights from its config; causal-LM head when one exists.

    `depth` sets the config's `num_hidden_layers` (the generic name every transformers config maps to
    its layer count) and cuts per-layer lists (`layer_types`) to match."""
    transformers = _transformers()
    config = _config(spec, transformers)
    config.use_cache = False
    if depth is not None:
        _reduce_depth(config, depth, spec.model)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        raise ProblemError(f"problem.huggingface: config of {spec.model!r} has no vocab_size")
    loss_fn = _logits_loss
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError:
        model = transformers.AutoModel.from_config(config)
        loss_fn = _hidden_loss
    blocks = _largest_module_list(model)
    if not blocks:
        raise ProblemError(
            f"problem.huggingface: found no layer list (nn.ModuleList) in {type(model).__name__}"
        )

    def make(key: BatchKey) -> Batch:
        return token_batch(key, vocab=vocab, sequence_length=spec.sequence_length)

    return TrainingProblem(
        name=f"hf-{spec.model}",
        model=model,
        blocks=blocks,
        make_batch=make,
        loss_fn=loss_fn,
        tokens_per_sample=spec.sequence_length,
    )

"""The runtime problem: a model, its per-block units, a deterministic batch source and a loss."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

Batch = Mapping[str, torch.Tensor]
"""Named input tensors of one micro-batch (on the CPU; the trainer moves them to the device)."""


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Which samples a micro-batch holds: samples [sample_start, sample_start + samples) of a step.

    Samples are numbered inside each optimizer step (0 .. global batch - 1) and each sample is drawn
    from its own generator seeded by (seed, step, sample index), so the data of a step does not
    depend on world size, micro-batch or accumulation: a resumed or re-planned run sees the same data.
    """

    seed: int
    step: int
    sample_start: int
    samples: int

    def sample_seeds(self) -> list[int]:
        """One 63-bit seed per sample, mixed from (seed, step, index) (splitmix64-style)."""
        return [_mix(self.seed, self.step, self.sample_start + i) for i in range(self.samples)]


def mix_seed(*values: int) -> int:
    """A 63-bit seed mixed from integers (splitmix64-style)."""
    return _mix(*values)


def _mix(*values: int) -> int:
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 31
    return state & 0x7FFFFFFFFFFFFFFF


def default_attention_of(block: nn.Module) -> nn.Module | None:
    """The attention sub-module of a block: the first direct child whose name mentions attention."""
    for name, child in block.named_children():
        lowered = name.lower()
        if "attn" in lowered or "attention" in lowered:
            return child
    return None


@dataclass(frozen=True, slots=True)
class TrainingProblem:
    """What to train. Entrypoints (`module:function`) return one of these.

    `blocks` are the repeated units (transformer layers): activation checkpointing and FSDP
    wrapping apply per block. `loss_fn(model, batch)` calls the (possibly wrapped) model and returns
    a scalar loss. `make_batch(key)` must be deterministic in its key.
    """

    name: str
    model: nn.Module
    blocks: list[nn.Module]
    make_batch: Callable[[BatchKey], Batch]
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor]
    tokens_per_sample: int = 1
    tokenizer: Any = None  # Hugging Face problems: the model's tokenizer (saved beside the fine-tuned model)
    eval_batches: Callable[[int], list[Batch]] | None = None  # spec.data's eval set, in micro-batches of n
    saved_dtype: torch.dtype | None = None  # pretrained weights: their checkpoint's dtype (the output keeps it)
    # FSDP: the pretrained weights live whole on rank 0 only (the other ranks built the model on the meta
    # device); the runner calls this after fully_shard to fill every rank's shards from rank 0.
    after_shard: Callable[[nn.Module, torch.device], None] | None = None
    attention_of: Callable[[nn.Module], nn.Module | None] = field(default=default_attention_of)
    # Language models: this problem with its head and cross-entropy run in chunks (memfit_trainer.chunked_loss);
    # None where there is no token loss to chunk (strategy.chunkedLoss is refused).
    enable_chunked_loss: Callable[[TrainingProblem], TrainingProblem] | None = None

    @property
    def parameter_count(self) -> int:
        """All parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())

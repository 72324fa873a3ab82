"""Chunked loss: a language model's output head and cross-entropy over CHUNKS chunks of the flattened tokens,
each chunk under non-reentrant activation checkpointing, so that only one chunk's logits exist at a time, in
forward and in backward (the full [tokens, vocab] fp32 logits never do). Same value as the unchunked mean.

CHUNKS = 8 as torchtune's `CEWithChunkedOutputLoss(num_output_chunks=8)` (torchtune/modules/loss); unlike it,
the head itself runs per chunk inside the checkpoint (as Liger-Kernel's fused linear cross-entropy does), since
the head's logits are what is large. The chunking happens inside the model's forward, where the head is
called as a module (`head(chunk)`), so that every engine's wrapper sees it: DDP's forward, FSDP2's root
unit (whose parameters are gathered for forward and backward), and DeepSpeed ZeRO-3's per-module forward
hooks, which gather the head's weight again for each recomputation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from memfit_trainer.problems.base import TrainingProblem

CHUNKS = 8
IGNORE_INDEX = -100  # F.cross_entropy's default; padding and BERT's unmasked positions
LOSS_CHUNKS_ATTR = "memfit_loss_chunks"  # set on the model whose loss runs chunked (runner facts read it)


def _chunk_loss_sum(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(
    head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor, *, chunks: int = CHUNKS
) -> torch.Tensor:
    """Mean cross-entropy of `head(hidden)` against `labels` (-100 ignored), computed over `chunks` chunks of
    the flattened tokens, each chunk's logits recomputed in backward: the sum over chunks divided by the
    number of non-ignored labels, which is F.cross_entropy's mean."""
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for part_hidden, part_labels in zip(flat_hidden.chunk(chunks), flat_labels.chunk(chunks), strict=True):
        total = total + checkpoint(_chunk_loss_sum, head, part_hidden, part_labels, use_reentrant=False)
    return total / (flat_labels != IGNORE_INDEX).sum()


def apply_chunked_loss(problem: TrainingProblem) -> TrainingProblem:
    """The problem with its loss chunked (`problem.enable_chunked_loss`); ValueError for a problem without a
    language-model head (ViT classifier, a model without an LM head, user entrypoints)."""
    if problem.enable_chunked_loss is None:
        raise ValueError(
            f"strategy.chunkedLoss: problem {problem.name!r} has no language-model head and token cross-entropy "
            "to chunk (supported: builtin gpt/bert and Hugging Face causal LMs); disable strategy.chunkedLoss"
        )
    chunked = problem.enable_chunked_loss(problem)
    setattr(chunked.model, LOSS_CHUNKS_ATTR, CHUNKS)
    return chunked


def loss_chunks(model: nn.Module) -> int:
    """How many chunks the model's loss runs in (0: not chunked)."""
    return int(getattr(model, LOSS_CHUNKS_ATTR, 0))

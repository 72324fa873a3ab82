"""Synthetic, learnable data: deterministic per sample so that resume restores the data position."""

from __future__ import annotations

import math

import torch

from memfit_trainer.problems.base import Batch, BatchKey

# BERT pre-training masks 15% of the tokens (Devlin et al. 2019, §3.1).
MASK_FRACTION = 0.15


def _arithmetic_sequence(seed: int, *, vocab: int, length: int) -> torch.Tensor:
    """tokens[t] = (start + stride * t) mod vocab: predictable after two tokens, so loss falls fast."""
    gen = torch.Generator().manual_seed(seed)
    start = int(torch.randint(vocab, (1,), generator=gen))
    stride = int(torch.randint(1, 4, (1,), generator=gen))
    return (start + stride * torch.arange(length)) % vocab


def token_batch(key: BatchKey, *, vocab: int, sequence_length: int) -> Batch:
    """Causal LM batch: `input_ids` and next-token `labels`, both [samples, sequence_length]."""
    rows = torch.stack(
        [_arithmetic_sequence(s, vocab=vocab, length=sequence_length + 1) for s in key.sample_seeds()]
    )
    return {"input_ids": rows[:, :-1].contiguous(), "labels": rows[:, 1:].contiguous()}


def masked_token_batch(key: BatchKey, *, vocab: int, sequence_length: int) -> Batch:
    """Masked LM batch: 15% of positions replaced by the last vocabulary id; labels -100 elsewhere."""
    mask_id = vocab - 1
    inputs, labels = [], []
    for seed in key.sample_seeds():
        tokens = _arithmetic_sequence(seed, vocab=vocab, length=sequence_length)
        gen = torch.Generator().manual_seed(seed ^ 0x5DEECE66D)
        masked = torch.rand(sequence_length, generator=gen) < MASK_FRACTION
        masked[int(torch.randint(sequence_length, (1,), generator=gen))] = True  # never an empty loss
        inputs.append(torch.where(masked, torch.full_like(tokens, mask_id), tokens))
        labels.append(torch.where(masked, tokens, torch.full_like(tokens, -100)))
    return {"input_ids": torch.stack(inputs), "labels": torch.stack(labels)}


def image_batch(key: BatchKey, *, image_size: int, num_classes: int) -> Batch:
    """Images whose horizontal frequency encodes the class, plus noise: `images` [n, 3, s, s], `labels`."""
    images, labels = [], []
    x = torch.arange(image_size, dtype=torch.float32) / image_size
    for seed in key.sample_seeds():
        gen = torch.Generator().manual_seed(seed)
        label = int(torch.randint(num_classes, (1,), generator=gen))
        phase = torch.arange(3, dtype=torch.float32).view(3, 1, 1)
        wave = torch.sin(2 * math.pi * (label + 1) * x.view(1, 1, -1) + phase).expand(3, image_size, -1)
        images.append(0.5 * wave + 0.5 * torch.randn(3, image_size, image_size, generator=gen))
        labels.append(label)
    return {"images": torch.stack(images), "labels": torch.tensor(labels)}

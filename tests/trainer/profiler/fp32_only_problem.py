"""An entrypoint problem for the tests: a small MLP language model whose token mixing is a float32-only
extension (a numpy kernel behind a custom autograd Function, as many user extensions are). Under bf16
autocast its input arrives in bf16 and numpy refuses it, as a device kernel without bf16 would: the
profile must skip those configurations and curves and keep the fp32 ones."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from memfit_trainer.problems import Batch, BatchKey, TrainingProblem
from torch import nn

VOCAB, HIDDEN, TOKENS = 128, 32, 16


class NumpyCumulativeMean(torch.autograd.Function):
    """Causal mean over the sequence, computed by numpy (float32 only: `.numpy()` refuses bf16)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        array = x.detach().cpu().numpy()
        counts = np.arange(1, array.shape[1] + 1, dtype=array.dtype)[None, :, None]
        return torch.from_numpy(np.cumsum(array, axis=1) / counts).to(x.device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        array = grad.detach().cpu().numpy()
        counts = np.arange(1, array.shape[1] + 1, dtype=array.dtype)[None, :, None]
        scaled = array / counts
        return torch.from_numpy(np.flip(np.cumsum(np.flip(scaled, 1), axis=1), 1).copy()).to(grad.device)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + NumpyCumulativeMean.apply(self.mix(x))
        return x + self.mlp(x)


class MixerLm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def problem() -> TrainingProblem:
    torch.manual_seed(0)
    model = MixerLm()

    def make_batch(key: BatchKey) -> Batch:
        rows = [torch.randint(0, VOCAB, (TOKENS + 1,), generator=torch.Generator().manual_seed(s))
                for s in key.sample_seeds()]
        return {"tokens": torch.stack(rows)}

    def loss_fn(m: nn.Module, batch: Batch) -> torch.Tensor:
        tokens = batch["tokens"]
        logits = m(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    return TrainingProblem(name="fp32-only-mixer", model=model, blocks=list(model.blocks), make_batch=make_batch,
                           loss_fn=loss_fn, tokens_per_sample=TOKENS)

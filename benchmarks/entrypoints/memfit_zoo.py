"""Entrypoint models memfit has no analytic form for (the accuracy benchmark's `entrypoint` section).

Each function is a `problem.entrypoint` (`memfit_zoo:cnn_small`): it returns a TrainingProblem whose
batch is deterministic in its key. Families: a convolutional net with BatchNorm, a recurrent (LSTM)
language model, a top-2 mixture of experts (data-dependent routing) and an encoder-decoder
transformer with two sequence lengths. Two sizes each, small enough for real CPU steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from memfit_trainer.problems import BatchKey, TrainingProblem
from torch import nn


def _generator(key: BatchKey, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(key.sample_seeds()[index])


def _tokens(key: BatchKey, length: int, vocab: int) -> torch.Tensor:
    return torch.stack([torch.randint(0, vocab, (length,), generator=_generator(key, i))
                        for i in range(key.samples)])


# --- convolutional net with BatchNorm ---------------------------------------------------------------


class ConvBlock(nn.Module):
    """Residual block: conv-BN-ReLU-conv-BN (+ strided projection when the width changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [ConvBlock(c, w, 1 if i == 0 else 2), ConvBlock(w, w, 1)]
            c = w
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def _cnn(name: str, widths: tuple[int, ...], image: int, classes: int = 100) -> TrainingProblem:
    model = ResNet(widths, classes)

    def make_batch(key: BatchKey) -> dict[str, torch.Tensor]:
        images = torch.stack([torch.randn(3, image, image, generator=_generator(key, i)) for i in range(key.samples)])
        labels = torch.stack([torch.randint(0, classes, (), generator=_generator(key, i)) for i in range(key.samples)])
        return {"images": images, "labels": labels}

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(m(batch["images"]).float(), batch["labels"])

    return TrainingProblem(name, model, list(model.blocks), make_batch, loss_fn, tokens_per_sample=image * image)


def cnn_small() -> TrainingProblem:
    return _cnn("cnn-small", (16, 32, 64), 32)


def cnn_large() -> TrainingProblem:
    return _cnn("cnn-large", (32, 64, 128), 48)


# --- recurrent language model -----------------------------------------------------------------------


class LstmLm(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(nn.LSTM(hidden, hidden, batch_first=True) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)[0]
        return self.head(x)


def _lstm(name: str, vocab: int, hidden: int, layers: int, seq: int) -> TrainingProblem:
    model = LstmLm(vocab, hidden, layers)

    def make_batch(key: BatchKey) -> dict[str, torch.Tensor]:
        return {"tokens": _tokens(key, seq + 1, vocab)}

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = batch["tokens"]
        logits = m(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    return TrainingProblem(name, model, list(model.layers), make_batch, loss_fn, tokens_per_sample=seq)


def lstm_small() -> TrainingProblem:
    return _lstm("lstm-small", 2000, 128, 2, 64)


def lstm_large() -> TrainingProblem:
    return _lstm("lstm-large", 4000, 256, 2, 96)


# --- top-k mixture of experts -----------------------------------------------------------------------


class MoeLayer(nn.Module):
    """Pre-norm top-k routed MLP experts (tokens gathered per expert: data-dependent shapes)."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.router = nn.Linear(hidden, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
                                     for _ in range(experts))
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = self.norm(x).reshape(-1, shape[-1])
        weights, chosen = torch.topk(self.router(h).softmax(dim=-1), self.top_k, dim=-1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, (expert(h[rows]) * weights[rows, slot, None]).to(out.dtype))
        return x + out.reshape(shape)


class MoeLm(nn.Module):
    def __init__(self, vocab: int, hidden: int, ffn: int, layers: int, experts: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(MoeLayer(hidden, ffn, experts, 2) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def _moe(name: str, hidden: int, ffn: int, layers: int, experts: int, seq: int, vocab: int = 2000) -> TrainingProblem:
    model = MoeLm(vocab, hidden, ffn, layers, experts)

    def make_batch(key: BatchKey) -> dict[str, torch.Tensor]:
        return {"tokens": _tokens(key, seq + 1, vocab)}

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = batch["tokens"]
        logits = m(tokens[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    return TrainingProblem(name, model, list(model.layers), make_batch, loss_fn, tokens_per_sample=seq)


def moe_small() -> TrainingProblem:
    return _moe("moe-small", 128, 256, 2, 4, 64)


def moe_large() -> TrainingProblem:
    return _moe("moe-large", 192, 384, 2, 8, 64)


# --- encoder-decoder transformer (two sequence lengths) ---------------------------------------------


class EncDec(nn.Module):
    def __init__(self, vocab: int, hidden: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.encoder = nn.ModuleList(nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, 0.0, batch_first=True)
                                     for _ in range(layers))
        self.decoder = nn.ModuleList(nn.TransformerDecoderLayer(hidden, heads, 4 * hidden, 0.0, batch_first=True)
                                     for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        memory = self.embed(source)
        for layer in self.encoder:
            memory = layer(memory)
        x = self.embed(target)
        for layer in self.decoder:
            x = layer(x, memory)
        return self.head(x)


def _encdec(name: str, hidden: int, layers: int, source: int, target: int, vocab: int = 2000) -> TrainingProblem:
    model = EncDec(vocab, hidden, 4, layers)

    def make_batch(key: BatchKey) -> dict[str, torch.Tensor]:
        return {"source": _tokens(key, source, vocab), "target": _tokens(key, target + 1, vocab)}

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        target = batch["target"]
        logits = m(batch["source"], target[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))

    blocks = [*model.encoder, *model.decoder]
    return TrainingProblem(name, model, blocks, make_batch, loss_fn, tokens_per_sample=source + target)


def encdec_small() -> TrainingProblem:
    return _encdec("encdec-small", 128, 2, 96, 32)


def encdec_large() -> TrainingProblem:
    return _encdec("encdec-large", 192, 2, 128, 48)

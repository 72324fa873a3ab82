"""Builtin models built from a shape: a GPT decoder LM, a BERT-style masked LM and a ViT classifier."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from memfit.api.problem import BuiltinProblem, ModelKind
from torch import nn

from memfit_trainer.chunked_loss import CHUNKS, IGNORE_INDEX, chunked_cross_entropy
from memfit_trainer.problems.base import Batch, BatchKey, TrainingProblem
from memfit_trainer.problems.data import image_batch, masked_token_batch, token_batch
from memfit_trainer.problems.layers import make_blocks

# Initialisation scale of GPT-2 (Radford et al. 2019, openai/gpt-2 model.py: normal(0, 0.02)).
INIT_STD = 0.02


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding | nn.Conv2d):
        nn.init.normal_(module.weight, std=INIT_STD)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


class TokenModel(nn.Module):
    """GPT (causal) or BERT (bidirectional) trunk with an untied output head.

    The head is not tied to the embedding so that every parameter belongs to exactly one FSDP unit.
    """

    def __init__(self, spec: BuiltinProblem) -> None:
        super().__init__()
        causal = spec.kind == ModelKind.GPT
        self.tok_emb = nn.Embedding(spec.vocab, spec.hidden)
        self.pos_emb = nn.Embedding(spec.sequence_length, spec.hidden)
        self.blocks = make_blocks(
            layers=spec.layers, hidden=spec.hidden, heads=spec.heads, ffn_hidden=spec.ffn, causal=causal
        )
        self.ln_f = nn.LayerNorm(spec.hidden)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.apply(_init_weights)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, *, loss_chunks: int = 0
    ) -> torch.Tensor:
        """The logits; with `labels`, the mean token cross-entropy instead, over `loss_chunks` chunks of
        tokens when given (memfit_trainer.chunked_loss: the full logits never exist)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        hidden = self.ln_f(x)
        if labels is None:
            return self.head(hidden)
        if loss_chunks:
            return chunked_cross_entropy(self.head, hidden, labels, chunks=loss_chunks)
        return F.cross_entropy(self.head(hidden).flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


class VisionTransformer(nn.Module):
    """ViT: patch embedding, class token, bidirectional blocks, linear classifier on the class token."""

    def __init__(self, spec: BuiltinProblem) -> None:
        super().__init__()
        patches = (spec.image_size // spec.patch_size) ** 2
        self.patch = nn.Conv2d(3, spec.hidden, kernel_size=spec.patch_size, stride=spec.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, spec.hidden))
        self.pos_emb = nn.Parameter(torch.zeros(1, patches + 1, spec.hidden))
        self.blocks = make_blocks(
            layers=spec.layers, hidden=spec.hidden, heads=spec.heads, ffn_hidden=spec.ffn, causal=False
        )
        self.ln_f = nn.LayerNorm(spec.hidden)
        self.head = nn.Linear(spec.hidden, spec.num_classes)
        self.apply(_init_weights)
        nn.init.normal_(self.pos_emb, std=INIT_STD)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1) + self.pos_emb.to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x[:, 0]))


def lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Token cross-entropy in fp32 (labels -100 are ignored: BERT's unmasked positions)."""
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)


def chunked_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """lm_loss's value with the head and cross-entropy run over CHUNKS chunks inside the model's forward."""
    return model(batch["input_ids"], labels=batch["labels"], loss_chunks=CHUNKS)  # type: ignore[no-any-return]


def classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Class cross-entropy in fp32."""
    return F.cross_entropy(model(batch["images"]).float(), batch["labels"])


def build_builtin(spec: BuiltinProblem) -> TrainingProblem:
    """The builtin model and its synthetic task for a shape from the job spec."""
    if spec.kind == ModelKind.VIT:
        vit = VisionTransformer(spec)
        return TrainingProblem(
            name=f"vit-{spec.layers}x{spec.hidden}",
            model=vit,
            blocks=list(vit.blocks),
            make_batch=lambda key: image_batch(key, image_size=spec.image_size, num_classes=spec.num_classes),
            loss_fn=classification_loss,
            tokens_per_sample=spec.tokens_per_sample,
        )
    model = TokenModel(spec)
    synth = token_batch if spec.kind == ModelKind.GPT else masked_token_batch

    def make(key: BatchKey) -> Batch:
        return synth(key, vocab=spec.vocab, sequence_length=spec.sequence_length)

    return TrainingProblem(
        name=f"{spec.kind.value}-{spec.layers}x{spec.hidden}",
        model=model,
        blocks=list(model.blocks),
        make_batch=make,
        loss_fn=lm_loss,
        tokens_per_sample=spec.tokens_per_sample,
        enable_chunked_loss=lambda problem: replace(problem, loss_fn=chunked_lm_loss),
    )

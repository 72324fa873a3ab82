"""Transformer building blocks shared by the builtin models (pre-LN, SDPA attention, GELU MLP)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head self-attention on `scaled_dot_product_attention` (scores are never materialised)."""

    def __init__(self, *, hidden: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, hidden // self.heads).unbind(dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=self.causal
        )
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class Mlp(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, *, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, ffn_hidden)
        self.out = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    """One pre-LN transformer block; `attn` is the unit selective checkpointing recomputes."""

    def __init__(self, *, hidden: int, heads: int, ffn_hidden: int, causal: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden=hidden, heads=heads, causal=causal)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = Mlp(hidden=hidden, ffn_hidden=ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def make_blocks(*, layers: int, hidden: int, heads: int, ffn_hidden: int, causal: bool) -> nn.ModuleList:
    """A ModuleList of identical blocks (the per-block units for checkpointing and FSDP)."""
    return nn.ModuleList(
        Block(hidden=hidden, heads=heads, ffn_hidden=ffn_hidden, causal=causal) for _ in range(layers)
    )

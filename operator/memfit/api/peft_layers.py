"""The linear layers LoRA can target, per known architecture: names, shared inputs, default targets,
and their widths for a (wire-form) problem. No API models here: the memory model and the rules read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Linear layers per transformer block, by architecture, grouped by the tensor they read: (input width,
# ((module name, output width), ...)) with widths as functions of the hidden size h, the K/V width kv and
# the MLP width f. Linear layers of one group read the same input (Llama's q/k/v, gate/up), which
# autograd saves once. Names are the modules' attribute names (memfit_trainer.problems.layers for
# builtin models; transformers' modeling files otherwise). GPT-2's `c_proj` and BERT's `dense` name
# several layers of a block; targeting the name targets all of them. Every architecture lists the
# same four groups in the same order: attention input, attention output, MLP input, MLP inner.
InputGroup = tuple[str, tuple[tuple[str, str], ...]]
_BUILTIN: tuple[InputGroup, ...] = (
    ("h", (("qkv", "3h"),)), ("h", (("proj", "h"),)), ("h", (("fc", "f"),)), ("f", (("out", "h"),)),
)
_GATED: tuple[InputGroup, ...] = (
    ("h", (("q_proj", "h"), ("k_proj", "kv"), ("v_proj", "kv"))), ("h", (("o_proj", "h"),)),
    ("h", (("gate_proj", "f"), ("up_proj", "f"))), ("f", (("down_proj", "h"),)),
)
_GPT2: tuple[InputGroup, ...] = (
    ("h", (("c_attn", "3h"),)), ("h", (("c_proj", "h"),)), ("h", (("c_fc", "f"),)), ("f", (("c_proj", "h"),)),
)
_BERT: tuple[InputGroup, ...] = (
    ("h", (("query", "h"), ("key", "h"), ("value", "h"))), ("h", (("dense", "h"),)),
    ("h", (("dense", "f"),)), ("f", (("dense", "h"),)),
)
ATTENTION_OUTPUT_GROUP = 1  # the group whose input is the attention's output
ARCHITECTURES: dict[str, tuple[InputGroup, ...]] = {
    "builtin": _BUILTIN, "llama": _GATED, "mistral": _GATED, "qwen2": _GATED, "qwen3": _GATED,
    "gpt2": _GPT2, "bert": _BERT, "vit": _BERT,
}


def module_names(arch: str) -> tuple[str, ...]:
    """The targetable linear module names of an architecture, in block order."""
    names = (name for _, members in ARCHITECTURES[arch] for name, _ in members)
    return tuple(dict.fromkeys(names))


# Default targets: every linear layer of the blocks (the QLoRA paper's finding that adapters on all
# linear layers are needed to match full fine-tuning, Dettmers et al. 2023 §4).
DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {arch: module_names(arch) for arch in ARCHITECTURES}

def architecture(problem: Mapping[str, Any] | None) -> str | None:
    """The architecture key of a (wire-form) problem, or None when its modules are known only from
    the model itself (entrypoints, other Hugging Face model types)."""
    if not isinstance(problem, Mapping):
        return None
    if isinstance(problem.get("builtin"), Mapping):
        return "builtin"
    hf = problem.get("huggingface")
    config = hf.get("config") if isinstance(hf, Mapping) else None
    model_type = config.get("model_type") if isinstance(config, Mapping) else None
    return model_type if isinstance(model_type, str) and model_type in ARCHITECTURES else None


def resolve_targets(problem: Mapping[str, Any] | None, targets: list[str]) -> list[str]:
    """The target modules: as given, else the architecture's default (empty when unknown)."""
    if targets:
        return list(targets)
    arch = architecture(problem)
    return list(DEFAULT_TARGETS[arch]) if arch else []


def _dims(problem: Mapping[str, Any]) -> dict[str, int] | None:
    builtin = problem.get("builtin")
    if isinstance(builtin, Mapping):
        h = builtin.get("hidden")
        if not isinstance(h, int):
            return None
        f = builtin.get("ffnHidden") or 4 * h
        return {"h": h, "3h": 3 * h, "kv": h, "f": int(f)}
    hf = problem.get("huggingface")
    config = hf.get("config") if isinstance(hf, Mapping) else None
    if not isinstance(config, Mapping):
        return None
    h = config.get("hidden_size", config.get("n_embd"))
    if not isinstance(h, int):
        return None
    heads = config.get("num_attention_heads", config.get("n_head"))
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or (h // heads if isinstance(heads, int) and heads else h)
    kv = kv_heads * head_dim if isinstance(kv_heads, int) and isinstance(head_dim, int) else h
    f = config.get("intermediate_size", config.get("n_inner")) or 4 * h
    return {"h": h, "3h": 3 * h, "kv": kv, "f": int(f) if isinstance(f, int) else 4 * h}


def block_input_groups(problem: Mapping[str, Any] | None, targets: list[str]
                       ) -> list[tuple[int, list[tuple[int, bool]]]] | None:
    """One block's linear layers as (input width, [(output width, targeted), ...]) per shared input, or
    None when the architecture or its dimensions are unknown."""
    arch = architecture(problem)
    dims = _dims(problem) if arch and isinstance(problem, Mapping) else None
    if arch is None or dims is None:
        return None
    chosen = set(targets)
    return [(dims[i], [(dims[o], name in chosen) for name, o in members]) for i, members in ARCHITECTURES[arch]]


def target_linears(problem: Mapping[str, Any] | None, targets: list[str]) -> list[tuple[int, int]] | None:
    """(in, out) of every targeted linear layer in one block, or None when the architecture or its
    dimensions are unknown."""
    groups = block_input_groups(problem, targets)
    if groups is None:
        return None
    return [(i, o) for i, members in groups for o, targeted in members if targeted]

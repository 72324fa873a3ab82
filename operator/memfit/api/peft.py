"""LoRA and QLoRA: the `strategy.peft` API, the adapter settings a Plan carries, and the linear layers
each known architecture offers as LoRA targets.

LoRA (Hu et al. 2021, arXiv 2106.09685) trains two low-rank matrices A (r x in) and B (out x r) next to
each targeted frozen linear layer, scaled by alpha / r. QLoRA (Dettmers et al. 2023, arXiv 2305.14314)
stores the frozen base in 4-bit NormalFloat with blockwise quantisation constants and trains the same
adapters in the compute dtype. Changing a full fine-tune into either changes the result, so memfit
chooses one only when the user allows it (`method`, or `auto` with `allowed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from memfit.api.common import LIST_MAX, ApiModel, PeftMethod, Precision, QuantType

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

# bitsandbytes 4-bit: 2 values per byte, one absmax per 64-value block (fp32, or with double
# quantisation 8-bit with one fp32 second-level absmax per 256 first-level constants) -- QLoRA §3,
# bitsandbytes/functional.py `quantize_4bit(blocksize=64)`, `compress_statistics`.
NF4_BLOCK = 64
NF4_NESTED_BLOCK = 256


class LoraSpec(ApiModel):
    """LoRA adapter settings (also used by QLoRA)."""

    rank: int = Field(default=16, ge=1, le=4096, description="Adapter rank r (A is r x in, B is out x r).")
    alpha: int = Field(default=32, ge=1, le=65536, description="Scaling numerator: updates are scaled by alpha / r.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter's input (0 = none).")
    target_modules: list[str] = Field(
        default_factory=list, max_length=LIST_MAX,
        description="Linear modules (attribute names, e.g. q_proj) that get adapters; empty = every linear "
        "layer of the blocks for a known architecture (builtin: qkv, proj, fc, out; llama/mistral/qwen: "
        "q_proj ... down_proj). Checked against the model's modules when it is profiled or trained.",
    )


class QloraSpec(ApiModel):
    """How QLoRA stores the frozen base."""

    quant_type: QuantType = Field(default=QuantType.NF4, description="nf4 (NormalFloat4) or fp4.")
    double_quant: bool = Field(
        default=True, description="Quantise the quantisation constants too (~0.37 bit/param less)."
    )
    compute_dtype: Precision = Field(
        default=Precision.AUTO,
        description="auto, bf16, fp16 or fp32: the dtype the 4-bit weights are dequantised to; pins the "
        "plan's precision for QLoRA configurations.",
    )


class PeftSpec(ApiModel):
    """Parameter-efficient fine-tuning the planner may use. It never switches a full fine-tune to LoRA
    on its own: `none` (default) keeps the full fine-tune, `lora`/`qlora` pin one, and `auto` lets it
    choose the cheapest of `allowed`."""

    method: PeftMethod = Field(default=PeftMethod.NONE, description="none, lora, qlora or auto (see allowed).")
    allowed: list[PeftMethod] = Field(
        default_factory=list, max_length=3,
        description="With method auto: the methods the planner may choose among (none, lora, qlora).",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Adapter settings (LoRA and QLoRA).")
    qlora: QloraSpec = Field(default_factory=QloraSpec, description="4-bit base settings (QLoRA).")

    def methods(self) -> tuple[PeftMethod, ...]:
        """The concrete methods the planner may use, in preference order (full fine-tune first)."""
        chosen = set(self.allowed) if self.method == PeftMethod.AUTO else {self.method}
        return tuple(m for m in (PeftMethod.NONE, PeftMethod.LORA, PeftMethod.QLORA) if m in chosen)


class AdapterSettings(ApiModel):
    """The resolved adapter settings of a LoRA/QLoRA plan (target modules named, nothing auto)."""

    rank: int = Field(ge=1)
    alpha: int = Field(ge=1)
    dropout: float = Field(ge=0, lt=1)
    target_modules: list[str] = Field(min_length=1, max_length=LIST_MAX)
    quant_type: QuantType = QuantType.NF4
    double_quant: bool = True

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


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


def resolve_targets(problem: Mapping[str, Any] | None, lora: LoraSpec) -> list[str]:
    """The target modules: as given, else the architecture's default (empty when unknown)."""
    if lora.target_modules:
        return list(lora.target_modules)
    arch = architecture(problem)
    return list(DEFAULT_TARGETS[arch]) if arch else []


def adapter_settings(problem: Mapping[str, Any] | None, peft: PeftSpec) -> AdapterSettings | None:
    """What a LoRA/QLoRA plan carries, or None when the targets are unknown (no default, none given)."""
    targets = resolve_targets(problem, peft.lora)
    if not targets:
        return None
    return AdapterSettings(rank=peft.lora.rank, alpha=peft.lora.alpha, dropout=peft.lora.dropout,
                           target_modules=targets[:LIST_MAX], quant_type=peft.qlora.quant_type,
                           double_quant=peft.qlora.double_quant)


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


def adapter_parameters_per_block(linears: list[tuple[int, int]], rank: int) -> int:
    """LoRA parameters of one block: r x (in + out) per targeted linear layer."""
    return sum(rank * (i + o) for i, o in linears)


def check_peft(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every violation of `strategy.peft` (wire form), with its field path and what is allowed."""
    strategy = spec.get("strategy")
    if not isinstance(strategy, Mapping) or not isinstance(peft := strategy.get("peft"), Mapping):
        return []
    base = "spec.strategy.peft"
    found: list[tuple[str, str]] = []
    method, allowed = peft.get("method", "none"), peft.get("allowed") or []
    allowed = [m for m in allowed if isinstance(m, str)] if isinstance(allowed, list) else []
    if method == "auto" and not allowed:
        found.append((f"{base}.allowed", "method auto needs a non-empty allowed list: any of none, lora, qlora"))
    if method != "auto" and allowed:
        found.append((f"{base}.allowed", f"allowed applies only to method auto (method is {method}); "
                      "remove it or set method: auto"))
    if "auto" in allowed:
        found.append((f"{base}.allowed", "allowed lists concrete methods: none, lora or qlora (not auto)"))
    uses = set(allowed) if method == "auto" else {method}
    if uses & {"lora", "qlora"}:
        found += _check_lora(spec.get("problem"), peft.get("lora"), base)
    if "qlora" in uses:
        found += _check_qlora(strategy, peft.get("qlora"), base, only=uses == {"qlora"})
    return found


def _check_lora(problem: Any, lora: Any, base: str) -> list[tuple[str, str]]:
    lora = lora if isinstance(lora, Mapping) else {}
    found: list[tuple[str, str]] = []
    arch = architecture(problem)
    targets = lora.get("targetModules") or []
    if arch is not None:
        known = module_names(arch)
        for index, name in enumerate(targets):
            if name not in known:
                found.append((f"{base}.lora.targetModules[{index}]",
                              f"{name!r} is not a linear layer of a {arch} block; allowed: {', '.join(known)}"))
    elif not targets and isinstance(problem, Mapping) and (problem.get("entrypoint") or problem.get("huggingface")):
        found.append((f"{base}.lora.targetModules", "no default targets for this model: name the linear "
                      "modules (attribute names, e.g. q_proj, v_proj)"))
    rank = lora.get("rank", 16)
    linears = target_linears(problem, [t for t in (targets or DEFAULT_TARGETS.get(arch or "", ()))])
    if linears and isinstance(rank, int):
        smallest = min(min(i, o) for i, o in linears)
        if rank > smallest:
            found.append((f"{base}.lora.rank", f"rank {rank} is larger than the smallest targeted layer "
                          f"dimension ({smallest}); use a rank of at most {smallest}"))
    return found


def _check_qlora(strategy: Mapping[str, Any], qlora: Any, base: str, *, only: bool) -> list[tuple[str, str]]:
    qlora = qlora if isinstance(qlora, Mapping) else {}
    found: list[tuple[str, str]] = []
    engine, stage, offload = strategy.get("engine", "auto"), strategy.get("zeroStage", "auto"), strategy.get("offload")
    if only and engine == "deepspeed" and isinstance(stage, int) and stage < 3:
        found.append((f"{base}.method", f"QLoRA's 4-bit base cannot be held by DeepSpeed ZeRO-{stage} "
                      "(it casts the model to its dtype); allowed engines: ddp, fsdp, or deepspeed with zeroStage 3"))
    if only and offload in ("cpu", "nvme"):
        found.append((f"{base}.method", f"QLoRA's 4-bit base cannot be offloaded (offload {offload}); "
                      "set offload to none or auto"))
    compute, precision = qlora.get("computeDtype", "auto"), strategy.get("precision", "auto")
    if compute != "auto" and precision not in (None, "auto") and compute != precision and only:
        found.append((f"{base}.qlora.computeDtype", f"computeDtype {compute} conflicts with strategy.precision "
                      f"{precision}; the 4-bit weights are dequantised to the training precision"))
    return found


"""LoRA and QLoRA: the `strategy.peft` API and the adapter settings a Plan carries (the linear layers of
each known architecture are in peft_layers.py, the cross-field rules in peft_rules.py).

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
from memfit.api.peft_layers import resolve_targets


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


def adapter_settings(problem: Mapping[str, Any] | None, peft: PeftSpec) -> AdapterSettings | None:
    """What a LoRA/QLoRA plan carries, or None when the targets are unknown (no default, none given)."""
    targets = resolve_targets(problem, list(peft.lora.target_modules))
    if not targets:
        return None
    return AdapterSettings(rank=peft.lora.rank, alpha=peft.lora.alpha, dropout=peft.lora.dropout,
                           target_modules=targets[:LIST_MAX], quant_type=peft.qlora.quant_type,
                           double_quant=peft.qlora.double_quant)

"""What to train: a builtin model, a Hugging Face config, or a user entrypoint."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, JsonValue

from memfit.api.common import ApiModel


class ModelKind(StrEnum):
    """Builtin model families."""

    GPT = "gpt"
    BERT = "bert"
    VIT = "vit"


class BuiltinProblem(ApiModel):
    """A transformer built by memfit from its shape, trained on synthetic data."""

    kind: ModelKind = Field(description="Model family: gpt (decoder LM), bert (encoder) or vit (vision).")
    layers: int = Field(ge=1, le=1024, description="Number of transformer blocks.")
    hidden: int = Field(ge=8, le=65536, description="Hidden size; must be divisible by heads.")
    heads: int = Field(ge=1, le=1024, description="Attention heads.")
    ffn_hidden: int | None = Field(
        default=None, ge=8, le=262144, description="MLP inner size; default 4 x hidden."
    )
    vocab: int = Field(default=32000, ge=2, le=1048576, description="Vocabulary size (gpt, bert).")
    sequence_length: int = Field(default=1024, ge=1, le=1048576, description="Tokens per sample (gpt, bert).")
    image_size: int = Field(default=224, ge=8, le=8192, description="Image side in pixels (vit).")
    patch_size: int = Field(default=16, ge=1, le=1024, description="Patch side in pixels (vit).")
    num_classes: int = Field(default=1000, ge=2, le=1048576, description="Classes (vit).")

    @property
    def ffn(self) -> int:
        """MLP inner size."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def tokens_per_sample(self) -> int:
        """Sequence positions per sample (patches + class token for vit)."""
        if self.kind == ModelKind.VIT:
            return (self.image_size // self.patch_size) ** 2 + 1
        return self.sequence_length


class HuggingFaceProblem(ApiModel):
    """A Hugging Face transformers model built with from_config (random weights, no download if inline)."""

    model: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[\w.\-]+(/[\w.\-]+)?$",
        description="Model id, e.g. meta-llama/Llama-3.2-1B; used for the config when none is inline.",
    )
    config: dict[str, JsonValue] | None = Field(
        default=None,
        description="Inline config.json contents; when given, nothing is downloaded.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    sequence_length: int = Field(default=2048, ge=1, le=1048576, description="Tokens per sample.")


class Problem(ApiModel):
    """Exactly one of builtin, huggingface or entrypoint."""

    builtin: BuiltinProblem | None = Field(default=None, description="A builtin model shape.")
    huggingface: HuggingFaceProblem | None = Field(default=None, description="A Hugging Face model.")
    entrypoint: str | None = Field(
        default=None,
        max_length=256,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="module.path:function in the image returning a memfit_trainer Problem.",
    )


def problem_config(problem: Problem) -> dict[str, Any]:
    """Wire form of the problem, used for hashing and for the trainer."""
    return problem.to_wire()

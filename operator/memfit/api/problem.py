"""What to train: a builtin model, a Hugging Face model (pretrained or from a config), or a user entrypoint."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, JsonValue

from memfit.api.common import NAME_MAX, ApiModel


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


DNSSubdomain = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
# A relative folder on a volume: no leading slash (a `..` segment is refused by the spec rules).
VOLUME_PATH = r"^[A-Za-z0-9._][A-Za-z0-9._/-]*$"


class Initialize(StrEnum):
    """Where the starting weights come from."""

    PRETRAINED = "pretrained"
    RANDOM = "random"


class Attention(StrEnum):
    """How a Hugging Face model computes attention (transformers' `attn_implementation`)."""

    AUTO = "auto"  # sdpa
    EAGER = "eager"  # the scores and softmax materialised (and saved for backward)
    SDPA = "sdpa"  # torch scaled_dot_product_attention: flash / memory-efficient kernels, scores never saved
    FLASH = "flash"  # flash_attention_2 (the flash-attn package, CUDA): the same memory as sdpa


class Task(StrEnum):
    """The head a Hugging Face model trains and its loss."""

    AUTO = "auto"  # seq2seq-lm for an encoder-decoder, else causal-lm
    CAUSAL_LM = "causal-lm"  # next-token prediction (AutoModelForCausalLM)
    MASKED_LM = "masked-lm"  # the token-prediction head of an encoder (AutoModelForMaskedLM)
    SEQ2SEQ_LM = "seq2seq-lm"  # encoder-decoder, teacher-forced (AutoModelForSeq2SeqLM)
    SEQUENCE_CLASSIFICATION = "sequence-classification"  # one label per sample (config num_labels)


# The heads transformers has for the architectures memfit models analytically (its AutoModelFor... classes):
# what `task` may ask of them (encoder-decoders and other architectures are checked when the model is built).
DECODER_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
TASKS_OF: dict[str, tuple[Task, ...]] = {
    **dict.fromkeys(DECODER_TYPES, (Task.CAUSAL_LM, Task.SEQUENCE_CLASSIFICATION)),
    "bert": (Task.CAUSAL_LM, Task.MASKED_LM, Task.SEQUENCE_CLASSIFICATION),
    "vit": (Task.SEQUENCE_CLASSIFICATION,),  # image classification: its only head
}


class SecretKeyRef(ApiModel):
    """A key of a Secret in the job's namespace."""

    name: DNSSubdomain = Field(description="Secret name.")
    key: str = Field(
        default="token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key holding the value; default `token`.",
    )


class HuggingFaceProblem(ApiModel):
    """A Hugging Face transformers model: pretrained weights from a volume or the hub, or random init.

    Weights source: `volumeClaim` + `path` (a `save_pretrained` folder on a PersistentVolumeClaim), else
    the hub `model` at `revision`. `initialize` defaults to `pretrained`, except that an inline `config`
    without a volume keeps its meaning from before pretrained weights existed: random weights built
    from that config (nothing is downloaded). With a weights source, an inline `config` is only the shape
    memfit plans with (the operator never reads volumes or the hub); the trainer refuses weights whose
    own config disagrees with it.
    """

    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^[\w.\-]+(/[\w.\-]+)?$",
        description="Hub model id, e.g. meta-llama/Llama-3.2-1B: the weights (and tokenizer) when no "
        "volumeClaim is given; otherwise only the model's display name. Required without a volumeClaim.",
    )
    revision: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=r"^[\w.\-/]+$",
        description="Hub revision (branch, tag or commit) of `model`; default main.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding a hub access token (gated or private models). The token reaches the "
        "trainer as the HF_TOKEN environment variable from the Secret; memfit never logs it or writes it "
        "to status, events or the Plan.",
    )
    volume_claim: str | None = Field(
        default=None, min_length=1, max_length=NAME_MAX, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="PersistentVolumeClaim holding the pretrained model (mounted read-only); needs `path`.",
    )
    path: str | None = Field(
        default=None, max_length=1024, pattern=VOLUME_PATH,
        description="Folder on volumeClaim written by `save_pretrained` (config.json, weights, tokenizer), "
        "relative to the volume's root, e.g. models/llama-3.2-1b.",
    )
    initialize: Initialize | None = Field(
        default=None,
        description="pretrained (load the weights) or random (the config's architecture, fresh weights). "
        "Default: pretrained, or random when an inline config is given without a volumeClaim.",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Allow model and tokenizer code shipped with the weights to run in the trainer "
        "(transformers' trust_remote_code). Off by default: only enable it for a source you trust.",
    )
    config: dict[str, JsonValue] | None = Field(
        default=None,
        description="Inline config.json contents: the shape memfit plans with (nothing is downloaded to "
        "plan). Without a volumeClaim and without `initialize: pretrained` it also means random weights.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    sequence_length: int = Field(
        default=2048, ge=1, le=1048576,
        description="Tokens per sample: real data is tokenized and packed to this length. Must not exceed "
        "the model's max_position_embeddings.",
    )
    attention: Attention | None = Field(
        default=None,
        description="auto (sdpa), eager (scores materialised: more activation memory), sdpa or flash "
        "(flash_attention_2, needs the flash-attn package in the trainer image).",
    )
    task: Task | None = Field(
        default=None,
        description="auto (seq2seq-lm for an encoder-decoder, else causal-lm), causal-lm, masked-lm, seq2seq-lm "
        "or sequence-classification (the config's num_labels, default 2).",
    )

    @property
    def attention_kind(self) -> Attention:
        """The effective attention (auto is sdpa)."""
        return Attention.SDPA if self.attention in (None, Attention.AUTO) else self.attention

    @property
    def task_kind(self) -> Task:
        """The requested task (auto: decided by the model's config)."""
        return self.task or Task.AUTO

    @property
    def initialization(self) -> Initialize:
        """The effective `initialize` (the documented default applied)."""
        if self.initialize is not None:
            return self.initialize
        if self.config is not None and self.volume_claim is None:
            return Initialize.RANDOM
        return Initialize.PRETRAINED

    def hub_files(self, *, tokenizer: bool) -> str:
        """What of the hub model the training pods need: `weights` (pretrained from the hub), `config`
        (config.json and tokenizer files: random weights without an inline config, or a tokenizer for
        real data), or "" (nothing: a volume model, or an inline config and no tokenizer needed)."""
        if self.volume_claim is not None or self.model is None:
            return ""
        if self.hub_weights:
            return "weights"
        return "config" if self.config is None or tokenizer else ""

    @property
    def hub_weights(self) -> bool:
        """Pretrained weights downloaded from the hub (`model`, no `volumeClaim`): the download step."""
        return self.volume_claim is None and self.model is not None and self.initialization == Initialize.PRETRAINED

    @property
    def name(self) -> str:
        """A display name: the hub id, else the folder on the volume."""
        return self.model or f"{self.volume_claim}:{self.path}"


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

"""`spec.data`: what the model is trained on (a hub dataset, files on a volume, or synthetic tokens)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from memfit.api.common import NAME_MAX, ApiModel
from memfit.api.problem import VOLUME_PATH

DEFAULT_TEXT_FIELD = "text"


class FileFormat(StrEnum):
    """How the dataset files are stored."""

    JSONL = "jsonl"
    PARQUET = "parquet"
    CSV = "csv"
    ARROW = "arrow"


class HubDataset(ApiModel):
    """A dataset on the Hugging Face hub, loaded with `datasets.load_dataset(name, config, split=...)`."""

    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[\w.\-]+(/[\w.\-]+)?$",
        description="Dataset id, e.g. tatsu-lab/alpaca.",
    )
    config: str | None = Field(default=None, min_length=1, max_length=256, description="Dataset configuration name.")
    split: str = Field(default="train", min_length=1, max_length=256, description="Training split; default train.")
    revision: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=r"^[\w.\-/]+$",
        description="Dataset revision (branch, tag or commit).",
    )


class VolumeFiles(ApiModel):
    """Dataset files on a PersistentVolumeClaim (mounted read-only into the training pods)."""

    volume_claim: str = Field(
        min_length=1, max_length=NAME_MAX, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="PersistentVolumeClaim holding the files.",
    )
    path: str = Field(
        max_length=1024, pattern=VOLUME_PATH,
        description="A file, or a folder whose files of `format` are read in name order, relative to the "
        "volume's root; for arrow, a `datasets` save_to_disk folder or .arrow files.",
    )
    format: FileFormat = Field(default=FileFormat.JSONL, description="jsonl, parquet, csv or arrow.")


class DataSpec(ApiModel):
    """Training data: exactly one of `huggingface`, `files` or `synthetic: true`.

    Text (`textField`, default `text`) or chat messages (`messagesField`: a list of {role, content}
    rendered with the tokenizer's chat template) are tokenized with the model's tokenizer, joined with
    its end-of-sequence token and packed into samples of `problem.huggingface.sequenceLength` tokens.
    Sample order is fixed by the job's seed and the sample's index, not by world size or micro-batch,
    so a re-planned run sees the same data. Without `spec.data` a job trains on synthetic tokens (what
    profiling always uses).
    """

    huggingface: HubDataset | None = Field(default=None, description="A dataset from the hub.")
    files: VolumeFiles | None = Field(default=None, description="Files on a volume.")
    synthetic: bool = Field(
        default=False, description="Train on synthetic tokens (profiling, benchmarks); no other source."
    )
    text_field: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="Column holding the text; default `text` unless messagesField is set.",
    )
    messages_field: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="Column holding chat messages ([{role, content}]), rendered with the tokenizer's chat "
        "template (the tokenizer must have one).",
    )
    eval_split: str | None = Field(
        default=None, min_length=1, max_length=256,
        description="huggingface: split evaluated for eval loss, e.g. validation.",
    )
    eval_path: str | None = Field(
        default=None, max_length=1024, pattern=VOLUME_PATH,
        description="files: file or folder on the same volume (same format) evaluated for eval loss.",
    )
    eval_every_steps: int = Field(
        default=0, ge=0, le=100_000_000,
        description="Eval loss every N optimizer steps (0: only before the first and after the last step).",
    )
    eval_samples: int = Field(
        default=64, ge=1, le=65536, description="Packed samples of the eval set evaluated each time (the first N).",
    )

    @property
    def real(self) -> bool:
        """The job trains on a dataset (not synthetic tokens)."""
        return self.huggingface is not None or self.files is not None

    @property
    def column(self) -> str:
        """The column read: messagesField when set, else textField (default `text`)."""
        return self.messages_field or self.text_field or DEFAULT_TEXT_FIELD

    @property
    def has_eval(self) -> bool:
        """An eval set is named."""
        return self.eval_split is not None or self.eval_path is not None

"""Real training data (`spec.data`): read rows, tokenize with the model's tokenizer, pack, order deterministically.

Documents are tokenized, each followed by the tokenizer's end-of-sequence token, concatenated and cut
into samples of sequenceLength + 1 tokens (input = the first sequenceLength, labels = the last
sequenceLength: next-token prediction). A tail that does not fill a sample is padded (eval sets, or a
dataset smaller than one sample); padded positions get label -100, which cross-entropy ignores. Sample order: the global sample number of (step, index in
the step's global batch) picks a position in a per-epoch permutation seeded by the job's seed, so the
data a step sees depends on neither world size nor micro-batch (the BatchKey contract).
"""

from __future__ import annotations

import csv
import functools
import importlib
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from memfit.api import pod as contract
from memfit.api.data import DataSpec, FileFormat

from memfit_trainer.file_access import denied, diagnose, explain, first_problem, probe
from memfit_trainer.problems.base import Batch, BatchKey, mix_seed
from memfit_trainer.problems.errors import ProblemError

ENV_VOLUMES_DIR = contract.ENV_VOLUMES_DIR
DEFAULT_VOLUMES_DIR = contract.VOLUMES_MOUNT
IGNORE_INDEX = -100
_SUFFIXES = {FileFormat.JSONL: (".jsonl", ".json"), FileFormat.PARQUET: (".parquet",),
             FileFormat.CSV: (".csv",), FileFormat.ARROW: (".arrow",)}


def volume_path(claim: str, path: str, *, field: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where `path` on PersistentVolumeClaim `claim` is mounted in this pod (ProblemError when absent, or
    when this process may not read it: memfit_trainer.file_access)."""
    root = Path((environ if environ is not None else os.environ).get(ENV_VOLUMES_DIR) or DEFAULT_VOLUMES_DIR)
    where = root / claim / path.strip("/")
    error = probe(where)
    if error is not None and not denied(error):
        raise ProblemError(f"{field}: {path!r} does not exist on volume {claim!r} (looked in {where})")
    if error is not None:
        raise ProblemError(f"{field}: {path!r} on volume {claim!r}: {diagnose(where, error)}")
    return where


@dataclass(frozen=True, slots=True)
class PackedSamples:
    """Packed token samples: `tokens` [n, sequenceLength + 1] and `valid` (False on padding)."""

    tokens: torch.Tensor
    valid: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def batch(self, indices: Sequence[int]) -> Batch:
        """input_ids and next-token labels (-100 where the target is padding)."""
        rows, valid = self.tokens[list(indices)], self.valid[list(indices)]
        labels = torch.where(valid[:, 1:], rows[:, 1:], torch.full_like(rows[:, 1:], IGNORE_INDEX))
        return {"input_ids": rows[:, :-1].contiguous(), "labels": labels.contiguous()}


def _files(where: Path, fmt: FileFormat, field: str) -> list[Path]:
    if where.is_file():
        return [where]
    found = sorted(p for p in where.rglob("*") if p.is_file() and p.suffix in _SUFFIXES[fmt])
    if not found:
        raise ProblemError(f"{field}: no {'/'.join(_SUFFIXES[fmt])} files in {where}")
    problem = first_problem(found)  # before any is opened: the datasets loaders hide which one failed
    if problem is not None:
        raise ProblemError(f"{field}: {problem}")
    return found


def _jsonl_rows(files: list[Path], field: str) -> Iterator[Mapping[str, Any]]:
    for file in files:
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ProblemError(f"{field}: {file.name} line {number} is not JSON: {exc}") from exc
                if not isinstance(row, dict):
                    raise ProblemError(f"{field}: {file.name} line {number} is not a JSON object")
                yield row


def _datasets() -> Any:
    try:
        return importlib.import_module("datasets")
    except ImportError as exc:
        raise ProblemError("spec.data needs the `datasets` package for parquet, csv, arrow and hub datasets; "
                           "use the memfit trainer image, or jsonl files") from exc


def _table_rows(files: list[Path], fmt: FileFormat, where: Path) -> Iterator[Mapping[str, Any]]:
    if fmt == FileFormat.CSV and not importlib.util.find_spec("datasets"):
        for file in files:
            with file.open(encoding="utf-8", newline="") as handle:
                yield from csv.DictReader(handle)
        return
    datasets = _datasets()
    if fmt == FileFormat.ARROW and where.is_dir() and (where / "dataset_info.json").exists():
        loaded = datasets.load_from_disk(str(where))  # a save_to_disk folder (what a download step writes)
    else:
        builder = {FileFormat.PARQUET: "parquet", FileFormat.CSV: "csv", FileFormat.ARROW: "arrow"}[fmt]
        loaded = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                       cache_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "memfit-datasets"))
    yield from loaded


def read_rows(data: DataSpec, *, eval_set: bool, environ: Mapping[str, str] | None = None
              ) -> Iterator[Mapping[str, Any]]:
    """The rows of the training (or eval) set of `spec.data`."""
    if data.files is not None:
        files_spec = data.files
        rel = data.eval_path if eval_set else files_spec.path
        field = "spec.data.evalPath" if eval_set else "spec.data.files.path"
        assert rel is not None
        where = volume_path(files_spec.volume_claim, rel, field=field, environ=environ)
        files = _files(where, files_spec.format, field)
        if files_spec.format == FileFormat.JSONL:
            return _jsonl_rows(files, field)
        return _table_rows(files, files_spec.format, where)
    assert data.huggingface is not None
    hub = data.huggingface
    split = data.eval_split if eval_set else hub.split
    try:
        return iter(_datasets().load_dataset(hub.name, hub.config, split=split, revision=hub.revision))
    except Exception as exc:  # hub errors come in many classes; the message says which
        field = "spec.data.evalSplit" if eval_set else "spec.data.huggingface"
        problem = explain(exc) or f"{type(exc).__name__}: {str(exc)[:300]}"
        raise ProblemError(f"{field}: cannot load {hub.name!r} split {split!r}: {problem}") from exc


def _field_name(data: DataSpec) -> str:
    return "spec.data.messagesField" if data.messages_field else "spec.data.textField"


def _document(row: Mapping[str, Any], index: int, *, data: DataSpec, tokenizer: Any) -> str:
    column, field = data.column, _field_name(data)
    if column not in row:
        raise ProblemError(f"{field}: the dataset has no column {column!r} (row {index}); its columns: "
                           f"{', '.join(sorted(map(str, row))) or 'none'}")
    value = row[column]
    if data.messages_field is None:
        if not isinstance(value, str):
            raise ProblemError(f"{field}: column {column!r} must hold text; row {index} holds "
                               f"{type(value).__name__}")
        return value
    if not isinstance(value, list) or not all(isinstance(m, Mapping) and "role" in m and "content" in m
                                              for m in value):
        raise ProblemError(f"{field}: column {column!r} must hold a list of {{role, content}} messages; "
                           f"row {index} holds {type(value).__name__}")
    if not getattr(tokenizer, "chat_template", None):
        raise ProblemError(f"{field}: the model's tokenizer has no chat template to render messages with; "
                           "use textField with pre-rendered text, or a tokenizer with a chat_template")
    return str(tokenizer.apply_chat_template(list(value), tokenize=False))


def pack(rows: Iterator[Mapping[str, Any]], *, data: DataSpec, tokenizer: Any, sequence_length: int,
         limit: int | None = None, keep_tail: bool = True) -> PackedSamples:
    """Tokenize and pack rows into samples of sequence_length + 1 tokens (at most `limit` samples).

    The tail that does not fill a sample is padded (labels -100) when `keep_tail` or when it is all the
    data there is. Training drops it otherwise: with only full samples every micro-batch has the same
    number of targets, so a step's loss (a mean of micro-batch means) does not depend on the split of
    the global batch into micro-batches and ranks."""
    width = sequence_length + 1
    eos = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (eos if eos is not None else 0)
    stream: list[int] = []
    samples: list[list[int]] = []
    for index, row in enumerate(rows):
        ids = list(tokenizer(_document(row, index, data=data, tokenizer=tokenizer))["input_ids"])
        stream += ids + ([eos] if eos is not None and (not ids or ids[-1] != eos) else [])
        while len(stream) >= width:
            samples.append(stream[:width])
            stream = stream[width:]
        if limit is not None and len(samples) >= limit:
            break
    valid = [[True] * width for _ in samples]
    if len(stream) > 1 and (limit is None or len(samples) < limit) and (keep_tail or not samples):
        valid.append([True] * len(stream) + [False] * (width - len(stream)))
        samples.append(stream + [pad] * (width - len(stream)))
    if not samples:
        raise ProblemError(f"{_field_name(data)}: the dataset yields no tokens to train on")
    samples, valid = samples[:limit], valid[:limit]
    return PackedSamples(torch.tensor(samples, dtype=torch.long), torch.tensor(valid, dtype=torch.bool))


@dataclass(frozen=True, slots=True)
class SampleOrder:
    """Maps (step, index in the step's global batch) to a packed sample: epoch-wise permutations."""

    seed: int
    global_batch_size: int
    samples: int

    def index(self, step: int, position: int) -> int:
        """The sample for global sample number (step - 1) x global batch + position."""
        number = (step - 1) * self.global_batch_size + position
        epoch, offset = divmod(number, self.samples)
        return int(_permutation(self.seed, epoch, self.samples)[offset])


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, samples: int) -> torch.Tensor:
    return torch.randperm(samples, generator=torch.Generator().manual_seed(mix_seed(seed, epoch)))


def packed_batch_source(samples: PackedSamples, *, seed: int, global_batch_size: int) -> Any:
    """make_batch(key) over packed samples, deterministic in the key."""
    order = SampleOrder(seed=seed, global_batch_size=global_batch_size, samples=len(samples))

    def make(key: BatchKey) -> Batch:
        return samples.batch([order.index(key.step, key.sample_start + i) for i in range(key.samples)])

    return make

"""Offline validation of memfit YAML: every violation with its field path and the allowed values."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from memfit.api.job import MemoryOptimizedTrainingJob
from memfit.api.pool import GPUNodePool
from memfit.api.rules import check_spec

KINDS: dict[str, type[BaseModel]] = {
    "MemoryOptimizedTrainingJob": MemoryOptimizedTrainingJob,
    "GPUNodePool": GPUNodePool,
}


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem in one document."""

    source: str
    path: str
    message: str

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.path}: {self.message}" if self.path else f"{self.source}: {self.message}"
        )


@dataclass(frozen=True, slots=True)
class Loaded:
    """A validated document."""

    source: str
    obj: BaseModel


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-after", "function-before")) or part in ("int", "literal['auto']"):
            continue  # pydantic's union/validator branch names are not field names
        else:
            out += f".{part}" if out else part
    return out


def _message(err: Any) -> str:
    kind, msg = str(err["type"]), str(err["msg"])
    if kind == "extra_forbidden":
        return "unknown field (not part of the API; check the spelling and `kubectl explain`)"
    if kind == "missing":
        return "required field is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind in ("enum", "literal_error"):
        return msg.replace("Input should be", "must be one of")
    return msg


def violations_from(error: ValidationError, source: str) -> list[Violation]:
    """Translate a pydantic error into field-path violations, dropping duplicate union branches."""
    seen: set[tuple[str, str]] = set()
    out: list[Violation] = []
    for err in error.errors():
        item = (_path(err["loc"]), _message(err))
        if item not in seen:
            seen.add(item)
            out.append(Violation(source, *item))
    return out


def validate_document(doc: Any, source: str) -> tuple[Loaded | None, list[Violation]]:
    """Validate one parsed YAML document of a memfit kind."""
    if not isinstance(doc, dict):
        return None, [Violation(source, "", f"expected a mapping, got {type(doc).__name__}")]
    kind = doc.get("kind")
    model = KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        allowed = ", ".join(KINDS)
        return None, [Violation(source, "kind", f"unknown kind {kind!r}; allowed: {allowed}")]
    try:
        return Loaded(source, model.model_validate(doc)), []
    except ValidationError as error:
        found = violations_from(error, source)
    if model is MemoryOptimizedTrainingJob:
        # Cross-field rules run on the raw spec, so they are reported even when field errors kept
        # pydantic from reaching its model validator (whose combined message is replaced here).
        found = [v for v in found if v.path != "spec" or not v.message.startswith("spec.")]
        known = {(v.path, v.message) for v in found}
        found += [Violation(source, p, m) for p, m in check_spec(doc.get("spec")) if (p, m) not in known]
    return None, found


def load_file(path: Path) -> tuple[list[Loaded], list[Violation]]:
    """Parse and validate every document in a YAML file."""
    loaded: list[Loaded] = []
    problems: list[Violation] = []
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError) as error:
        return [], [Violation(str(path), "", f"cannot read: {error}")]
    except yaml.YAMLError as error:
        return [], [Violation(str(path), "", f"not valid YAML: {error}")]
    docs = [d for d in docs if d is not None]
    for index, doc in enumerate(docs):
        name = doc.get("metadata", {}).get("name") if isinstance(doc, dict) else None
        source = f"{path}" + (f"[{index}]" if len(docs) > 1 else "") + (f" ({name})" if name else "")
        item, errs = validate_document(doc, source)
        problems.extend(errs)
        if item is not None:
            loaded.append(item)
    if not docs:
        problems.append(Violation(str(path), "", "no YAML documents found"))
    return loaded, problems

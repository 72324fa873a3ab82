"""Read and check the profiler's input: the Problem wire JSON (a MOTJ `spec.problem`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memfit.api.problem import Problem
from memfit.api.rules import check_spec
from memfit.api.validation import violations_from
from pydantic import ValidationError

from memfit_trainer.profiler.errors import ProfileInputError

SPEC_PREFIX = "spec."


def read_problem_document(path: Path) -> Any:
    """The parsed JSON (or YAML, a superset) document; a `spec.problem` or a MOTJ is unwrapped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileInputError("problem", f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        import yaml  # YAML is a superset of JSON: accept a problem copied from a manifest

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ProfileInputError("problem", f"{path} is neither JSON nor YAML: {exc}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("spec"), dict) and "problem" in doc["spec"]:
        doc = doc["spec"]["problem"]
    elif isinstance(doc, dict) and set(doc) == {"problem"}:
        doc = doc["problem"]
    return doc


def parse_problem(doc: Any) -> Problem:
    """Validate a Problem wire document; the first violation becomes a field-named error.

    Field checks are pydantic's (unknown kind, zero or negative sizes); cross-field checks are the
    MOTJ rules (exactly one source, heads divide hidden, patch divides image), so the profiler and
    `memfit validate` report the same message for the same mistake.
    """
    if not isinstance(doc, dict):
        raise ProfileInputError("problem", f"expected a JSON object, got {type(doc).__name__}")
    findings = [(path, msg) for path, msg in check_spec({"problem": doc}) if path.startswith("spec.problem")]
    try:
        problem = Problem.model_validate(doc)
    except ValidationError as error:
        violation = violations_from(error, "problem")[0]
        field = f"problem.{violation.path}" if violation.path else "problem"
        raise ProfileInputError(field, violation.message) from None
    if findings:
        path, message = findings[0]
        raise ProfileInputError(path.removeprefix(SPEC_PREFIX), message)
    return problem


def load_problem(path: Path) -> Problem:
    """Read, parse and check a problem file."""
    return parse_problem(read_problem_document(path))

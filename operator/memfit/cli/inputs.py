"""Reading the files `memfit plan` and `memfit estimate` take; bad input becomes `InputError` (exit 2)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError

from memfit.api import rules
from memfit.api.job import MemoryOptimizedTrainingJob, StrategySpec
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.api.validation import Violation, load_file, violations_from
from memfit.planner import PoolRejection


class InputError(Exception):
    """Invalid input: printed as `error: ...` lines, exit code 2."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)

    def report(self) -> int:
        """Print the lines as `error: ...` on stderr; the exit code (2)."""
        for line in self.lines:
            print(f"error: {line}", file=sys.stderr)
        return 2


# Pinned strategy combinations that cannot run. `memfit validate` and admission reject them; `memfit
# plan` answers them as the planner does (NoFit with the reason, exit 1), as issue 4 asks.
PIN_RULES = (rules.ddp_does_not_shard, rules.ddp_does_not_offload, rules.nvme_needs_deepspeed)


def _job_with_impossible_pins(path: Path, problems: Sequence[Violation]) -> MemoryOptimizedTrainingJob | None:
    """The job when its only problems are impossible pin combinations (else None)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    doc = next((d for d in docs if d.get("kind") == "MemoryOptimizedTrainingJob"), None)
    spec = doc.get("spec") if doc is not None else None
    if doc is None or not isinstance(spec, dict) or not isinstance(spec.get("strategy"), dict):
        return None
    pins = {finding for rule in PIN_RULES if (finding := rule(spec)) is not None}
    if not pins or any((p.path, p.message) not in pins for p in problems):
        return None
    try:
        strategy = StrategySpec.model_validate(spec["strategy"])
        rest = {**doc, "spec": {k: v for k, v in spec.items() if k != "strategy"}}
        job = MemoryOptimizedTrainingJob.model_validate(rest)
    except ValidationError:
        return None
    return job.model_copy(update={"spec": job.spec.model_copy(update={"strategy": strategy})})


def load_job(path: Path, *, allow_impossible_pins: bool = False) -> MemoryOptimizedTrainingJob:
    loaded, problems = load_file(path)
    if problems:
        job = _job_with_impossible_pins(path, problems) if allow_impossible_pins else None
        if job is not None:
            return job
        raise InputError([str(p) for p in problems])
    jobs = [item.obj for item in loaded if isinstance(item.obj, MemoryOptimizedTrainingJob)]
    if not jobs:
        raise InputError([f"{path}: no MemoryOptimizedTrainingJob in the file"])
    return jobs[0]


def load_pools(path: Path) -> tuple[list[GPUNodePool], list[PoolRejection]]:
    """Valid pools, and invalid pool documents turned into rejections (so planning goes on)."""
    loaded, problems = load_file(path)
    unreadable = [p for p in problems if p.path == "" and ("cannot read" in p.message or "YAML" in p.message)]
    if unreadable:
        raise InputError([str(p) for p in unreadable])
    pools = [item.obj for item in loaded if isinstance(item.obj, GPUNodePool)]
    rejected = [PoolRejection(_pool_name(p.source), f"invalid ({p.source}): {p.path}: {p.message}")
                for p in problems]
    if not pools and not rejected:
        raise InputError([f"{path}: no GPUNodePool in the file"])
    return pools, rejected


def _pool_name(source: str) -> str:
    """`pools.yaml[2] (l4-spot)` -> `l4-spot` (the source when the document has no name)."""
    if source.endswith(")") and " (" in source:
        return source.rsplit(" (", 1)[1][:-1]
    return source


def load_profile(path: Path) -> Profile:
    try:
        return Profile.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError([f"{path}: cannot read: {error}"]) from None
    except ValidationError as error:
        raise InputError([str(v) for v in violations_from(error, str(path))]) from None


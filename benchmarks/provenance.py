"""Where a benchmark result came from: the commit, the source paths it measures and their digest.

Every result in benchmarks/results/ carries a `provenance` block written by `stamp`:

    {"commit": "<HEAD when it ran>", "dirty": <uncommitted changes under the measured paths>,
     "measures": ["operator/memfit/planner", ...], "sources_sha256": "<digest of those files>",
     "command": "python benchmarks/planner.py"}

`stale_reason` recomputes the digest from the working tree; tests/unit/test_benchmark_results.py
fails when a result's measured sources changed after it was produced and nobody reran it, so the
README and docs quote only fresh figures. The digest covers file contents (not commit ids), so a
result produced from uncommitted code and committed together with that code is fresh.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def measured_files(measures: Sequence[str]) -> list[str]:
    """Tracked and not-ignored untracked files under the measured paths, sorted (what a clean
    clone of the commit that adds the result would hold)."""
    listed = _git("ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *measures)
    return sorted({f for f in listed.split("\0") if f and (REPO / f).is_file()})


def sources_sha256(measures: Sequence[str]) -> str:
    """Digest of the measured paths: every file's path and content, in path order."""
    digest = hashlib.sha256()
    for name in measured_files(measures):
        digest.update(name.encode() + b"\0")
        digest.update(hashlib.sha256((REPO / name).read_bytes()).digest())
    for missing in sorted(m for m in measures if not (REPO / m).exists()):
        digest.update(b"missing\0" + missing.encode() + b"\0")  # a measured path that went away
    return digest.hexdigest()


def stamp(measures: Sequence[str], *, command: str | None = None) -> dict[str, Any]:
    """The provenance block of a result produced now from the working tree."""
    dirty = bool(_git("status", "--porcelain", "--", *measures).strip())
    return {
        "commit": _git("rev-parse", "HEAD").strip(),
        "dirty": dirty,
        "measures": list(measures),
        "sources_sha256": sources_sha256(measures),
        "command": command or "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }


def changed_files_since(commit: str, measures: Sequence[str]) -> list[str]:
    """Measured files that differ from `commit` (for the message; empty when the commit is unknown)."""
    try:
        out = _git("diff", "--name-only", commit, "--", *measures)
    except subprocess.CalledProcessError:
        return []
    return [line for line in out.splitlines() if line]


def stale_reason(result: dict[str, Any]) -> str | None:
    """Why a result no longer measures the code at hand, or None when it is fresh."""
    block = result.get("provenance")
    if not isinstance(block, dict) or not {"commit", "measures", "sources_sha256", "command"} <= block.keys():
        return "it has no provenance block (commit, measures, sources_sha256, command)"
    measures = [str(m) for m in block["measures"]]
    if not measures:
        return "its provenance names no measured paths"
    if sources_sha256(measures) == block["sources_sha256"]:
        return None
    changed = changed_files_since(str(block["commit"]), measures)
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    return (f"its measured sources changed after it was produced at {str(block['commit'])[:12]}"
            f"{': ' + shown if shown else ''}; rerun `{block['command']}`")

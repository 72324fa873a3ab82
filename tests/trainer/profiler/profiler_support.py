"""Problems and runners shared by the profiler tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
TORCH_EXTENSIONS_DIR = os.environ.get(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "memfit" / "torch_extensions")
)
TINY = {
    "gpt": {
        "builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "sequenceLength": 64}
    },
    "bert": {
        "builtin": {"kind": "bert", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "sequenceLength": 64}
    },
    "vit": {
        "builtin": {
            "kind": "vit",
            "layers": 2,
            "hidden": 64,
            "heads": 4,
            "imageSize": 32,
            "patchSize": 8,
            "numClasses": 10,
        }
    },
}


def run_profile_cli(
    args: list[str], *, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """`python -m memfit_trainer.cli profile ...` in a subprocess; (exit code, stdout, stderr)."""
    full_env = {**os.environ, "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "memfit_trainer.cli", "profile", *args],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, proc.stdout, proc.stderr


def write_problem(tmp_path: Path, problem: Any, name: str = "problem.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(problem) if not isinstance(problem, str) else problem)
    return path

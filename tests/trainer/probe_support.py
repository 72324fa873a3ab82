"""Launchers for the probe's tests: `memfit-trainer probe` over a command, and a command run under the probe."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from trainer_support import PYTHON, REPO, subprocess_env

PROBE_LOOP = Path(__file__).resolve().parent / "probe_loop.py"
TRAIN_LOOP = REPO / "examples" / "own-code" / "train_loop.py"


def probe_cli(tmp: Path, command: list[str], *, micro_batches: str, steps: int = 3, timeout_s: float = 60,
              env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:  # fmt: skip
    """Run `memfit-trainer probe`; its exit code, the summary it wrote, and its stderr."""
    out = tmp / "profile.json"
    proc = subprocess.run(
        [PYTHON, "-m", "memfit_trainer.cli", "probe", "--micro-batches", micro_batches, "--steps", str(steps),
         "--timeout", str(timeout_s), "--out", str(out), "--", *command],
        env=subprocess_env(tmp, **(env or {})), cwd=REPO, capture_output=True, text=True, timeout=timeout_s * 6 + 60,
        check=False,
    )  # fmt: skip
    summary = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, summary, proc.stderr


def point(summary: dict[str, Any], micro_batch: int) -> dict[str, Any]:
    return next(p for p in summary["points"] if p["microBatch"] == micro_batch)

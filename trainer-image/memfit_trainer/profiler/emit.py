"""Write the Profile: to the output file, to stdout and to the pod's termination-message path."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from memfit.api import pod as contract
from memfit.api.profile import Measurement, Profile

TERMINATION_ENV = contract.ENV_TERMINATION_MESSAGE_PATH
DEFAULT_TERMINATION_PATH = Path("/dev/termination-log")
MAX_MESSAGE_BYTES = 4096  # Kubernetes truncates termination messages at 4 KiB


def compact_json(profile: Profile) -> str:
    """The Profile's compact JSON, shortened to fit 4 KiB: measurements dropped from the end, then
    activation curves. A depth-reduced profile loses a configuration at every depth at once (a
    configuration measured at one depth only could not be scaled to the full model)."""
    text = profile.to_json()
    while len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
        if profile.measurements:
            last = _config(profile.measurements[-1])
            kept = [m for m in profile.measurements if _config(m) != last]
            profile = profile.model_copy(update={"measurements": kept})
        elif profile.activation_curves:
            tail = profile.activation_curves[-1]
            key = (tail.precision, tail.checkpointing, tail.gradients_held)
            curves = [c for c in profile.activation_curves if (c.precision, c.checkpointing, c.gradients_held) != key]
            profile = profile.model_copy(update={"activation_curves": curves})
        else:
            break
        text = profile.to_json()
    return text


def _config(m: Measurement) -> tuple[object, ...]:
    return (m.precision, m.checkpointing, m.micro_batch_size, m.optimizer8bit)


def termination_path() -> Path | None:
    """$MEMFIT_TERMINATION_MESSAGE_PATH, else /dev/termination-log when it exists and is writable."""
    configured = os.environ.get(TERMINATION_ENV)
    if configured:
        return Path(configured)
    if DEFAULT_TERMINATION_PATH.exists() and os.access(DEFAULT_TERMINATION_PATH, os.W_OK):
        return DEFAULT_TERMINATION_PATH
    return None


def emit_profile(profile: Profile, *, out: Path | None, stdout: TextIO | None = None) -> str:
    """Write the compact JSON everywhere it is wanted; returns the text. Never raises on a sink."""
    text = compact_json(profile)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    print(text, file=stdout or sys.stdout, flush=True)
    path = termination_path()
    if path is not None:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:  # the profile is still on stdout and in --out
            print(f"memfit-trainer profile: cannot write {path}: {exc}", file=sys.stderr)
    return text

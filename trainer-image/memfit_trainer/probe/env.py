"""The probe's variables (named in memfit.api.pod, the pod contract), its defaults and its files.

`startup/sitecustomize.py` spells ENV_PROBE_OUT once more, so that an inactive probe imports nothing
(tests/trainer/test_probe.py checks the two agree; tests/unit/api/test_pod_contract.py allows that one).
"""

from __future__ import annotations

from pathlib import Path

from memfit.api.pod import ENV_PROBE_OUT, ENV_PROBE_STEPS

__all__ = ["DEFAULT_PROBE_STEPS", "ENV_PROBE_OUT", "ENV_PROBE_STEPS", "STARTUP_DIR", "rank_result_path"]

DEFAULT_PROBE_STEPS = 3
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # the folder the driver prepends to PYTHONPATH


def rank_result_path(out: Path, rank: int) -> Path:
    """Rank 0 writes `out`; rank r of a torchrun job writes `<out>.rank<r>` beside it."""
    return out if rank == 0 else out.with_name(f"{out.name}.rank{rank}")

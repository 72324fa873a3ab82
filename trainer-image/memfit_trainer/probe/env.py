"""The probe's variables (named in memfit.api.pod, the pod contract), its defaults and its files.

`startup/sitecustomize.py` spells ENV_PROBE_OUT once more, so that an inactive probe imports nothing
(tests/trainer/test_probe.py checks the two agree; tests/unit/api/test_pod_contract.py allows that one).
"""

from __future__ import annotations

from pathlib import Path

from memfit.api.pod import ENV_PROBE_OUT, ENV_PROBE_STEPS

__all__ = ["DEFAULT_PROBE_STEPS", "ENV_PROBE_BUDGET_BYTES", "ENV_PROBE_MONITOR", "ENV_PROBE_OUT", "ENV_PROBE_STEPS",
           "STARTUP_DIR", "rank_result_path"]

DEFAULT_PROBE_STEPS = 3
# Between the monitor of a training pod (memfit_trainer.probe.monitor) and the hooks in its script's processes
# only (not the pod contract: the operator sets neither).
ENV_PROBE_MONITOR = "MEMFIT_PROBE_MONITOR"  # "1": count every step, never end the process at MEMFIT_PROBE_STEPS
ENV_PROBE_BUDGET_BYTES = "MEMFIT_PROBE_BUDGET_BYTES"  # the first MEMFIT_PROBE_STEPS steps' peak limit
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # the folder the driver prepends to PYTHONPATH


def rank_result_path(out: Path, rank: int) -> Path:
    """Rank 0 writes `out`; rank r of a torchrun job writes `<out>.rank<r>` beside it."""
    return out if rank == 0 else out.with_name(f"{out.name}.rank{rank}")

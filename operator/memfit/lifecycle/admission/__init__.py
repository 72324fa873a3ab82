"""PURE: the `memfit.dev/memory-fit` Kueue AdmissionCheck for Jobs memfit did not launch.

`memory_fit.py` holds the contract and the fit rule (a verdict from a Workload, its Job's problem
document and the pools); `decide.py` turns one Workload's snapshot into a `CheckDecision` whose effects
(`SetAdmissionCheck`, `PostEvent`) the controller (controller/admission/) applies with the same
`apply_writes` as a MOTJ's decision. docs/kueue.md has the contract.
"""

from __future__ import annotations

from memfit.lifecycle.admission.decide import (
    CheckDecision,
    WorkloadSnapshot,
    decide_workload,
    problem_config_map,
)

__all__ = ["CheckDecision", "WorkloadSnapshot", "decide_workload", "problem_config_map"]

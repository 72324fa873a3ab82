"""PURE planner: job spec x GPUNodePools (x profile, measured peaks) -> Plan, alternatives, reasons.

No I/O, no clock and no module globals: the GPU catalog comes in as an argument. The operator calls
`plan(spec, pools=..., catalog=CATALOG, profile=..., measured_peaks=..., free_gpus=...)` and writes
`result.plan` (ConfigMap), `plan_summary(result)` (status) and `result.message()` (condition / event).
"""

from __future__ import annotations

from memfit.planner.baseline import cheapest_plain_baseline, fp32_baseline, plain_baseline, static_baseline
from memfit.planner.explain import plan_summary
from memfit.planner.measured import MeasuredPeak
from memfit.planner.offers import Offer, PoolRejection, catalog_pools, resolve_offers
from memfit.planner.plan_job import ANALYTIC_HEADROOM_PERCENT, build_plan, plan, resolve_shape, search_context
from memfit.planner.practitioner import practitioner_baseline
from memfit.planner.result import BaselineResult, Candidate, PlanResult

__all__ = [
    "ANALYTIC_HEADROOM_PERCENT",
    "BaselineResult",
    "Candidate",
    "MeasuredPeak",
    "Offer",
    "PlanResult",
    "PoolRejection",
    "build_plan",
    "catalog_pools",
    "cheapest_plain_baseline",
    "fp32_baseline",
    "plain_baseline",
    "plan",
    "plan_summary",
    "practitioner_baseline",
    "resolve_offers",
    "resolve_shape",
    "search_context",
    "static_baseline",
]

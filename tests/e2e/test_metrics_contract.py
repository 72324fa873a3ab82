"""The dashboard's and alerts' metric contract (e2e_metrics.py) matches what the real exporters expose:
operator/memfit/metrics.py, and memfit_trainer's exporter once it exists."""

from __future__ import annotations

import importlib.util

import pytest
from e2e_metrics import OPERATOR_METRICS, TRAINER_METRICS
from prometheus_client.parser import text_string_to_metric_families

TARGET_LABELS = {"namespace", "pool", "pod"}  # added by the PodMonitor, not by the trainer's exporter


def _families(text: str) -> dict[str, set[str]]:
    """{series family name as queried (counters with _total): label names of its samples}."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        name = family.name + suffix
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        out[name] = labels
    return out


def test_operator_exports_the_contract() -> None:
    if importlib.util.find_spec("memfit.metrics") is None:
        pytest.skip("operator/memfit/metrics.py does not exist yet")
    from memfit import metrics
    from prometheus_client import REGISTRY, generate_latest

    snapshot = metrics.JobSnapshot(
        namespace="ml", name="contract", phase="Running", pool="l4", predicted_peak_bytes=1e9,
        measured_peak_bytes=1.1e9, gpu_memory_bytes=2e9, price_per_hour=1.0, baseline_price_per_hour=4.0,
        savings_percent=75.0, spend_dollars=0.5, predicted_cost_dollars=2.0,
        engine="deepspeed", precision="bf16", zero_stage="2", checkpointing="full", offload="none",
        optimizer8bit="true",
        # status.progress as the operator stores it (camelCase), through the same parsing as a real status
        progress=metrics.JobSnapshot.from_status("ml", "contract", {"progress": {
            "step": 10, "maxSteps": 100, "steps": "10/100", "loss": 2.0, "evalLoss": 2.1,
            "tokensPerSecond": 1000.0, "etaSeconds": 90, "eta": "1m30s"}}).progress)
    assert dict(snapshot.progress) == {"step": 10.0, "maxSteps": 100.0, "loss": 2.0, "evalLoss": 2.1,
                                       "tokensPerSecond": 1000.0, "etaSeconds": 90.0}
    metrics.JOBS.observe(snapshot)
    children = [(metrics.REPLANS, ("ml", "OutOfMemory")), (metrics.PROFILING_FAILURES, ("ml",)),
                (metrics.RECONCILE_ERRORS, ("MemoryOptimizedTrainingJob",))]
    for counter, labels in children:
        counter.labels(*labels)  # a zero-valued child, so that its labels are exposed
    try:
        exported = _families(generate_latest(REGISTRY).decode())
    finally:
        metrics.JOBS.forget("ml", "contract")
        for counter, labels in children:
            counter.remove(*labels)
    for name, labels in OPERATOR_METRICS.items():
        assert name in exported, f"{name} is not exported by memfit.metrics"
        assert exported[name] == set(labels), f"{name}: labels {sorted(exported[name])} != {sorted(labels)}"


def test_trainer_exports_the_contract() -> None:
    if importlib.util.find_spec("memfit_trainer.metrics") is None:
        pytest.skip("trainer-image/memfit_trainer/metrics.py does not exist yet (per-rank exporter)")
    from memfit_trainer.metrics import TrainerMetrics
    from prometheus_client import generate_latest

    exported = _families(generate_latest(TrainerMetrics(job="contract", rank=0).registry).decode())
    for name, labels in TRAINER_METRICS.items():
        assert name in exported, f"{name} is not exported by memfit_trainer.metrics"
        if exported[name]:  # the plan info has no sample before set_plan()
            assert exported[name] == set(labels) - TARGET_LABELS, name

"""The metric contract the dashboard and alerts are built on, and the PromQL they contain."""

from __future__ import annotations

import re
from typing import Any

import yaml
from e2e_tools import CHART

JOB = frozenset({"namespace", "job", "pool"})
TRAINER = frozenset({"namespace", "job", "pool", "pod", "rank"})  # namespace/pool/pod: PodMonitor target labels
PLAN_KEYS = frozenset({"engine", "precision", "zero_stage", "checkpointing", "offload", "optimizer8bit"})

OPERATOR_METRICS: dict[str, frozenset[str]] = {
    "memfit_jobs": frozenset({"namespace", "phase"}),
    "memfit_job_predicted_peak_bytes": JOB,
    "memfit_job_measured_peak_bytes": JOB,
    "memfit_job_gpu_memory_bytes": JOB,
    "memfit_job_price_dollars_per_hour": JOB,
    "memfit_job_baseline_price_dollars_per_hour": frozenset({"namespace", "job"}),
    "memfit_job_savings_ratio": frozenset({"namespace", "job"}),
    "memfit_job_spend_dollars_total": frozenset({"namespace", "job"}),
    "memfit_job_predicted_cost_dollars": frozenset({"namespace", "job"}),
    "memfit_job_info": JOB | PLAN_KEYS,
    "memfit_job_progress_step": frozenset({"namespace", "job"}),
    "memfit_job_max_steps": frozenset({"namespace", "job"}),
    "memfit_job_loss": frozenset({"namespace", "job"}),
    "memfit_job_eval_loss": frozenset({"namespace", "job"}),
    "memfit_job_tokens_per_second": frozenset({"namespace", "job"}),
    "memfit_job_eta_seconds": frozenset({"namespace", "job"}),
    "memfit_replans_total": frozenset({"namespace", "reason"}),
    "memfit_profiling_failures_total": frozenset({"namespace"}),
    "memfit_profile_duration_seconds": frozenset(),
    "memfit_plan_duration_seconds": frozenset(),
    "memfit_reconcile_errors_total": frozenset({"kind"}),
    "memfit_build_info": frozenset({"version"}),
}
HISTOGRAMS = frozenset({"memfit_profile_duration_seconds", "memfit_plan_duration_seconds",
                        "memfit_trainer_step_seconds"})
TRAINER_METRICS: dict[str, frozenset[str]] = {
    "memfit_trainer_allocated_bytes": TRAINER,
    "memfit_trainer_reserved_bytes": TRAINER,
    "memfit_trainer_peak_bytes": TRAINER,
    "memfit_trainer_step_seconds": TRAINER,  # histogram
    "memfit_trainer_samples_total": TRAINER,
    "memfit_trainer_tokens_per_second": TRAINER,
    "memfit_trainer_loss": TRAINER,
    "memfit_trainer_step_peak_bytes": TRAINER,
    "memfit_trainer_device_memory_bytes": TRAINER,
    "memfit_trainer_step": TRAINER,
    "memfit_trainer_eval_loss": TRAINER,
    "memfit_trainer_resumed_from_step": TRAINER,
    "memfit_trainer_plan_info": TRAINER | {"engine", "stage", "precision", "checkpointing", "offload", "optimizer",
                                           "micro_batch", "accumulation", "world_size", "attempt"},
}
OTHER_METRICS: dict[str, frozenset[str]] = {
    "DCGM_FI_DEV_FB_USED": frozenset({"namespace", "pod", "GPU_I_PROFILE"}),  # MiB, dcgm-exporter with --kubernetes
    "DCGM_FI_DEV_FB_FREE": frozenset({"namespace", "pod", "GPU_I_PROFILE"}),
    "up": frozenset({"job"}),
}
ALL_METRICS = OPERATOR_METRICS | TRAINER_METRICS | OTHER_METRICS

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}
Query = tuple[str, str]  # (where it is used, PromQL)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (histogram series mapped to the histogram's name)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)\b(?!\s*\()", text):
        name = match[1]
        if name.lower() in KEYWORDS:
            continue
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        names.add(base if base in HISTOGRAMS else name)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    """(panel title / refId, expr) of every panel target."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variable, series selector, label) of every label_values() template variable."""
    out = []
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
            assert match, var["query"]
            out.append((var["name"], match[1], match[2]))
    return out


def rule_queries() -> list[Query]:
    groups = yaml.safe_load((CHART / "files" / "prometheus" / "alerts.yaml").read_text())["groups"]
    return [(str(r.get("alert") or r.get("record")), str(r["expr"])) for g in groups for r in g["rules"]]


def grafana_to_promql(expr: str, rate_interval: str = "4s", **variables: str) -> str:
    """Expand Grafana's variables as Grafana would for the given selections ("All" is ".*"); $__rate_interval
    is 4 scrape intervals (Grafana's floor), the tests scrape every second."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    expr = expr.replace("$__range", "1h")
    for name in ("namespace", "job", "pool"):
        expr = expr.replace(f"${name}", variables.get(name, ".*"))
    assert "$" not in expr, expr
    return expr

"""The Grafana dashboard: generated from hack/dashboard (grafana-foundation-sdk), well formed, and built on
exactly the metric names the operator and the trainers export."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
from e2e_metrics import ALL_METRICS, dashboard_queries, metric_names, rule_queries
from e2e_tools import CHART, REPO

DASHBOARD: dict[str, Any] = json.loads((CHART / "files" / "dashboards" / "memfit.json").read_text())
REQUIRED_PANELS = {
    "Per-GPU peak: predicted vs measured vs capacity", "Memory headroom", "Step time", "Samples per second",
    "Price per hour: plan vs baseline", "Savings vs baseline per job", "Jobs by phase",
    "Re-plans by reason (per hour)", "Prediction error", "GPU framebuffer used (DCGM)",
}


def test_generated_json_is_up_to_date() -> None:
    pytest.importorskip("grafana_foundation_sdk", reason="pip install grafana-foundation-sdk (dev extra)")
    result = subprocess.run([sys.executable, str(REPO / "hack" / "dashboard" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_variables() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "job", "pool"]
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "pool"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"] and var["allValue"] == ".*"
        assert var["datasource"]["uid"] == "${datasource}"
        assert re.fullmatch(rf"label_values\(memfit_job_info(\{{.*\}})?, {name}\)", var["query"]), var["query"]


def test_panels_layout_and_datasource() -> None:
    panels = DASHBOARD["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and 0 not in ids
    assert {p["title"] for p in panels} >= REQUIRED_PANELS
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids), p["title"]


def test_every_query_filters_by_the_variables() -> None:
    """Per-job metrics honour namespace (and job/pool where the metric has them)."""
    for title, expr in dashboard_queries(DASHBOARD):
        for name in metric_names(expr):
            labels = ALL_METRICS.get(name)
            if not labels & {"namespace", "job", "pool"} or name == "up":
                continue
            selectors = re.findall(rf"{name}(?:_bucket|_sum|_count)?\{{([^}}]*)\}}", expr)
            assert selectors, f"{title}: {name} has no label selector"
            for sel in selectors:
                for var in ("namespace", "job", "pool"):
                    if var in labels:
                        assert f'{var}=~"${var}"' in sel or f"${var}" in sel, f"{title}: {name} ignores ${var}"


def test_queries_use_only_exported_metric_names() -> None:
    queries = dashboard_queries(DASHBOARD) + rule_queries()
    used = {name for _, expr in queries for name in metric_names(expr)}
    unknown = used - set(ALL_METRICS)
    assert not unknown, f"not exported by the operator, the trainers, DCGM or Prometheus: {sorted(unknown)}"
    assert {"memfit_job_predicted_peak_bytes", "memfit_trainer_peak_bytes", "DCGM_FI_DEV_FB_USED"} <= used

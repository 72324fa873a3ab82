"""Every dashboard and alert query, evaluated by a real Prometheus (127.0.0.1) that scrapes exporters with
memfit's metric names and realistic values (fake_exporters.py), returns data, with the expected numbers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_metrics import dashboard_queries, grafana_to_promql, rule_queries, variable_queries
from e2e_prom import Prometheus, fake_exporter, prometheus, scrape_config, stop_process
from e2e_tools import CHART
from fake_exporters import LLAMA, SLICE_FREE_MIB, SLICE_JOB, SLICE_USED_MIB, TIGHT

DASHBOARD = json.loads((CHART / "files" / "dashboards" / "memfit.json").read_text())
RULES = CHART / "files" / "prometheus" / "alerts.yaml"
SCRAPES = 6  # samples per target before querying: rate() over 4s and increase() need several


@dataclass
class Stack:
    prom: Prometheus
    operator: subprocess.Popen[str]


@pytest.fixture(scope="module")
def stack(prom_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ExitStack() as es:
        ports = {}
        procs = {}
        for role in ("operator", "trainer-llama", "trainer-tight", "dcgm"):
            procs[role], ports[role] = es.enter_context(fake_exporter(role))

        def trainer(role: str, job: object) -> dict[str, object]:
            return {"targets": [f"127.0.0.1:{ports[role]}"],  # what the chart's PodMonitor relabels to
                    "labels": {"namespace": job.namespace, "pool": job.pool,  # type: ignore[attr-defined]
                               "pod": f"{job.name}-train-0-0-x7k2p"}}  # type: ignore[attr-defined]

        config = scrape_config({
            "memfit-operator": [{"targets": [f"127.0.0.1:{ports['operator']}"],
                                 "labels": {"namespace": "memfit-system"}}],
            "memfit-trainer": [trainer("trainer-llama", LLAMA), trainer("trainer-tight", TIGHT)],
            "dcgm-exporter": [{"targets": [f"127.0.0.1:{ports['dcgm']}"]}],
        }, [RULES])
        prom = es.enter_context(prometheus(prom_bin, tmp_path_factory.mktemp("prometheus"), config))
        prom.wait_for(f"{SCRAPES} scrapes of every target", lambda: len(prom.query(
            f"count_over_time(up[1m]) >= {SCRAPES} and up == 1")) == 4, timeout=60)
        yield Stack(prom, procs["operator"])


def _value(sample: dict[str, object]) -> float:
    return float(sample["value"][1])  # type: ignore[index]


QUERIES = dashboard_queries(DASHBOARD)


@pytest.mark.parametrize("expr", [q for _, q in QUERIES], ids=[t for t, _ in QUERIES])
def test_dashboard_query_returns_data(stack: Stack, expr: str) -> None:
    result = stack.prom.query(grafana_to_promql(expr))
    assert result, f"no data for {expr}"


@pytest.mark.parametrize("var,selector,label", variable_queries(DASHBOARD), ids=lambda v: str(v)[:30])
def test_variable_values(stack: Stack, var: str, selector: str, label: str) -> None:
    series = stack.prom.api("series", **{"match[]": grafana_to_promql(selector)})
    values = sorted({s[label] for s in series})
    expected = {"namespace": [LLAMA.namespace, TIGHT.namespace], "job": sorted([LLAMA.name, TIGHT.name]),
                "pool": [LLAMA.pool, TIGHT.pool]}[var]
    assert values == expected


def test_variables_narrow_the_panels(stack: Stack) -> None:
    (headroom,) = [q for t, q in QUERIES if t.startswith("Memory headroom")]
    one_ns = stack.prom.query(grafana_to_promql(headroom, namespace=LLAMA.namespace))
    assert [s["metric"]["job"] for s in one_ns] == [LLAMA.name]
    one_pool = stack.prom.query(grafana_to_promql(headroom, pool=TIGHT.pool))
    assert [s["metric"]["job"] for s in one_pool] == [TIGHT.name]
    several = stack.prom.query(grafana_to_promql(headroom, job=f"({LLAMA.name}|{TIGHT.name})"))
    assert len(several) == 2
    (dcgm,) = [q for t, q in QUERIES if t.startswith("GPU framebuffer used")]
    pods = {s["metric"]["pod"] for s in stack.prom.query(grafana_to_promql(dcgm, job=TIGHT.name))}
    assert pods == {f"{TIGHT.name}-train-0-0-x7k2p", f"{TIGHT.name}-train-0-1-x7k2p"}


def test_dashboard_numbers(stack: Stack) -> None:
    by_title = {t.split(" / ")[0]: q for t, q in QUERIES if t.endswith(" / A")}

    def per_job(title: str) -> dict[str, float]:
        return {s["metric"]["job"]: _value(s) for s in stack.prom.query(grafana_to_promql(by_title[title]))}

    headroom = per_job("Memory headroom")
    assert headroom[LLAMA.name] == pytest.approx(1 - max(LLAMA.rank_peaks_bytes) / LLAMA.gpu_bytes)
    assert headroom[TIGHT.name] == pytest.approx(1 - max(TIGHT.rank_peaks_bytes) / TIGHT.gpu_bytes)
    error = per_job("Prediction error")
    assert error[TIGHT.name] == pytest.approx(TIGHT.measured_bytes / TIGHT.predicted_bytes - 1)
    assert per_job("Step time") == pytest.approx({LLAMA.name: LLAMA.step_seconds, TIGHT.name: TIGHT.step_seconds})
    samples = per_job("Samples per second")
    assert samples[LLAMA.name] == pytest.approx(2 * LLAMA.micro_batch / LLAMA.step_seconds, rel=0.1)
    (savings,) = stack.prom.query(grafana_to_promql(by_title["Savings vs baseline"]))
    plan = LLAMA.price_per_hour + TIGHT.price_per_hour
    assert _value(savings) == pytest.approx(1 - plan / (LLAMA.baseline_per_hour + TIGHT.baseline_per_hour))
    (running,) = stack.prom.query(grafana_to_promql(by_title["Jobs running"]))
    assert _value(running) == 2
    (fb,) = [s for s in stack.prom.query(grafana_to_promql(by_title["GPU framebuffer used (DCGM)"]))
             if s["metric"]["pod"].endswith("-1-x7k2p") and s["metric"]["namespace"] == LLAMA.namespace]
    assert _value(fb) == pytest.approx(LLAMA.rank_peaks_bytes[1] * 1.04, rel=1e-4)



def test_dcgm_panels_read_device_plugin_dra_and_mig_series_alike(stack: Stack) -> None:
    """dcgm-exporter's per-pod series of a device-plugin GPU (LLAMA), a DRA-allocated GPU (TIGHT: the series
    also name the claim) and a MIG instance (the slice job; its parent GPU's own series has no pod): one
    line per pod (and instance profile) in both DCGM panels, the headroom of a slice counted on the slice."""
    by_title = {t.split(" / ")[0]: q for t, q in QUERIES if t.endswith(" / A")}
    used = {(s["metric"]["namespace"], s["metric"]["pod"]): s
            for s in stack.prom.query(grafana_to_promql(by_title["GPU framebuffer used (DCGM)"]))}
    ns, name, _ = SLICE_JOB
    slice_pod = (ns, f"{name}-train-0-0-m4c1z")
    assert set(used) == {*((j.namespace, f"{j.name}-train-0-{r}-x7k2p") for j in (LLAMA, TIGHT) for r in (0, 1)),
                         slice_pod}
    assert used[slice_pod]["metric"]["GPU_I_PROFILE"] == "1g.10gb"
    assert _value(used[slice_pod]) == SLICE_USED_MIB * 2**20
    assert _value(used[(TIGHT.namespace, f"{TIGHT.name}-train-0-1-x7k2p")]) == pytest.approx(
        TIGHT.rank_peaks_bytes[1] * 1.04, rel=1e-4)  # the DRA-mode series
    headroom = {(s["metric"]["namespace"], s["metric"]["pod"]): _value(s)
                for s in stack.prom.query(grafana_to_promql(by_title["GPU framebuffer headroom (DCGM)"]))}
    assert set(headroom) == set(used)
    assert headroom[slice_pod] == pytest.approx(SLICE_FREE_MIB / (SLICE_USED_MIB + SLICE_FREE_MIB))
    t4_used = round(TIGHT.rank_peaks_bytes[0] * 1.04 / 2**20)
    assert headroom[(TIGHT.namespace, f"{TIGHT.name}-train-0-0-x7k2p")] == pytest.approx(1 - t4_used / 15360)
    narrowed = stack.prom.query(grafana_to_promql(by_title["GPU framebuffer used (DCGM)"], job=name))
    assert [(s["metric"]["namespace"], s["metric"]["pod"]) for s in narrowed] == [slice_pod]

ALERT_JOBS = {
    "MemfitJobMemoryHeadroomLow": {"namespace": TIGHT.namespace, "job": TIGHT.name},
    "MemfitPredictionErrorHigh": {"namespace": TIGHT.namespace, "job": TIGHT.name, "pool": TIGHT.pool},
    "MemfitJobsReplanningRepeatedly": {"namespace": TIGHT.namespace, "reason": "OutOfMemory"},
    "MemfitProfilingFailing": {"namespace": TIGHT.namespace},
}


@pytest.mark.parametrize("alert,expr", [q for q in rule_queries() if q[0] in ALERT_JOBS],
                         ids=lambda v: str(v)[:40])
def test_alert_query_returns_the_unhealthy_job_only(stack: Stack, alert: str, expr: str) -> None:
    result = stack.prom.query(expr)
    assert result, f"{alert}: no data"
    for sample in result:
        labels = {k: v for k, v in sample["metric"].items() if k in ALERT_JOBS[alert]}
        assert labels == ALERT_JOBS[alert], sample


def test_rules_load_and_alerts_go_pending(stack: Stack) -> None:
    groups = stack.prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(rule_queries())
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]

    def active() -> dict[str, list[dict[str, str]]]:
        out: dict[str, list[dict[str, str]]] = {}
        for a in stack.prom.api("alerts")["alerts"]:
            out.setdefault(a["labels"]["alertname"], []).append(a["labels"])
        return out

    stack.prom.wait_for("job alerts pending", lambda: set(ALERT_JOBS) <= set(active()), timeout=20)
    alerts = active()
    assert "MemfitOperatorDown" not in alerts
    for name, labels in ALERT_JOBS.items():
        assert len(alerts[name]) == 1 and labels.items() <= alerts[name][0].items(), alerts[name]
        assert alerts[name][0]["severity"] == "warning"


def test_operator_down(stack: Stack) -> None:
    """Runs last in this module: stops the operator exporter."""
    (down_expr,) = [q for n, q in rule_queries() if n == "MemfitOperatorDown"]
    assert stack.prom.query(down_expr) == []
    stop_process(stack.operator)
    stack.prom.wait_for("up == 0 for the operator", lambda: bool(stack.prom.query(down_expr)), timeout=20)
    (sample,) = stack.prom.query(down_expr)
    assert sample["metric"]["job"] == "memfit-operator"

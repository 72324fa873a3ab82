"""ServiceMonitor, PodMonitor and the Grafana dashboard ConfigMap as rendered (ci/monitoring-on-values.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_chart import Rendered, helm_template, render_variant
from e2e_tools import CHART

DASHBOARD = CHART / "files" / "dashboards" / "memfit.json"


@pytest.fixture(scope="module")
def monitoring(helm: Path) -> Rendered:
    return render_variant(helm, "monitoring-on")


def test_service_monitor_scrapes_the_operator_service(monitoring: Rendered) -> None:
    monitor = monitoring.one("ServiceMonitor")
    service = monitoring.one("Service", "memfit-metrics")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["selector"]["matchLabels"] == service["spec"]["selector"]
    assert spec["namespaceSelector"] == {"matchNames": ["memfit-system"]}
    assert spec["jobLabel"] == "memfit.dev/scrape-job"
    assert service["metadata"]["labels"]["memfit.dev/scrape-job"] == "memfit-operator"
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "http-metrics"
    assert endpoint["honorLabels"] is True and endpoint["path"] == "/metrics"
    assert service["spec"]["ports"][0]["targetPort"] == "http-metrics"


def test_pod_monitor_scrapes_trainer_pods(monitoring: Rendered) -> None:
    from memfit.kube import names

    monitor = monitoring.one("PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    # The operator labels training pods so (operator/memfit/kube/names.py).
    assert spec["selector"]["matchLabels"] == {names.LABEL_COMPONENT: names.COMPONENT_TRAINER}
    assert spec["selector"]["matchExpressions"] == [{"key": names.LABEL_JOB, "operator": "Exists"}]
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel == {"pool": ["__meta_kubernetes_pod_label_memfit_dev_pool"], "pod": ["__meta_kubernetes_pod_name"]}


def test_trainer_pods_expose_the_port_the_pod_monitor_scrapes() -> None:
    from memfit.api import pod

    assert pod.METRICS_PORT == 9400


def test_dashboard_configmap(monitoring: Rendered) -> None:
    cm = monitoring.one("ConfigMap", "memfit-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "ML"}
    assert cm["data"]["memfit.json"] == DASHBOARD.read_text()
    assert json.loads(cm["data"]["memfit.json"])["uid"] == "memfit-overview"


def test_dashboard_namespace_and_disable(helm: Path) -> None:
    elsewhere, _ = helm_template(helm, "--set", "grafanaDashboard.namespace=monitoring")
    assert elsewhere.one("ConfigMap", "memfit-dashboard")["metadata"]["namespace"] == "monitoring"
    off, _ = helm_template(helm, "--set", "grafanaDashboard.enabled=false")
    assert not [c for c in off.kind("ConfigMap") if c["metadata"]["name"] == "memfit-dashboard"]

"""memfit's alert rules: `promtool check rules`, `promtool test rules`, conventions, and the PrometheusRule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from e2e_chart import helm_template
from e2e_tools import CHART, REPO, run

RULES = CHART / "files" / "prometheus" / "alerts.yaml"
UNIT_TESTS = Path(__file__).parent / "rules" / "alerts_test.yaml"
DOC = REPO / "docs" / "observability.md"
REQUIRED_ALERTS = {"MemfitJobMemoryHeadroomLow", "MemfitPredictionErrorHigh", "MemfitJobsReplanningRepeatedly",
                   "MemfitProfilingFailing", "MemfitOperatorDown"}


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules(prom_bin: Path) -> None:
    result = run([prom_bin / "promtool", "check", "rules", RULES])
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests(prom_bin: Path) -> None:
    result = run([prom_bin / "promtool", "test", "rules", UNIT_TESTS])
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("mutation", [("< 0.05", "< 0.01"), ("> 0.15", "> 0.25"), (">= 3", ">= 20"),
                                      ("for: 5m", "for: 1m")], ids=lambda m: f"{m[0]} -> {m[1]}")
def test_unit_tests_catch_a_changed_rule(prom_bin: Path, tmp_path: Path, mutation: tuple[str, str]) -> None:
    """The unit tests are not vacuous: a mutated threshold or duration makes them fail."""
    old, new = mutation
    text = RULES.read_text()
    assert old in text
    (tmp_path / "alerts.yaml").write_text(text.replace(old, new, 1))
    tests = UNIT_TESTS.read_text().replace("../../../charts/memfit/files/prometheus/alerts.yaml", "alerts.yaml")
    (tmp_path / "alerts_test.yaml").write_text(tests)
    result = run([prom_bin / "promtool", "test", "rules", tmp_path / "alerts_test.yaml"], check=False)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_alert_conventions() -> None:
    rules = alerts()
    assert {str(r["alert"]) for r in rules} == REQUIRED_ALERTS
    doc = DOC.read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", doc, re.M)}
    for rule in rules:
        name = str(rule["alert"])
        assert re.fullmatch(r"\d+m", str(rule["for"])), name
        labels, annotations = rule["labels"], rule["annotations"]
        assert isinstance(labels, dict) and isinstance(annotations, dict)
        assert labels["severity"] in ("warning", "critical"), name
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        anchor = str(annotations["runbook_url"]).rsplit("#", 1)[1]
        assert anchor == name.lower() and anchor in anchors, f"{name}: no runbook heading in {DOC.name}"


def test_prometheus_rule_renders_the_same_groups(helm: Path) -> None:
    rendered, _ = helm_template(helm, "--set", "prometheusRule.enabled=true",
                                "--set", "prometheusRule.runbookBaseURL=https://runbooks.example/memfit",
                                "--set", "prometheusRule.additionalLabels.release=kps")
    rule = rendered.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    expected = yaml.safe_load(RULES.read_text())
    for group in expected["groups"]:
        for r in group["rules"]:
            r["annotations"]["runbook_url"] = f"https://runbooks.example/memfit#{r['alert'].lower()}"
    assert rule["spec"] == expected


def test_no_prometheus_operator_objects_by_default(helm: Path) -> None:
    rendered, _ = helm_template(helm)
    assert not [o for o in rendered.objects if o["apiVersion"].startswith("monitoring.coreos.com/")]

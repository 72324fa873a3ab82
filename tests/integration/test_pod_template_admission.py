"""The real API server refuses, through the CRD's CEL rules, every pod template that touches what memfit
owns (the cases memfit_testbed.pod_template_cases shares with the operator's own rules), in the operator's
words; and accepts a platform's whole template."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.pod_template_cases import REFUSED

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def _job(name: str, template: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"] = {"name": name}
    doc["spec"]["podTemplate"] = template
    return doc


def _create(kube: Kube, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.CustomObjectsApi(kube.api_client).create_namespaced_custom_object(
        "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", doc)
    return result


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_admission_refuses_a_template_touching_what_memfit_owns(
    kube: Kube, namespace: str, install_crds: list[str], case: str
) -> None:
    template, _, message = REFUSED[case]
    with pytest.raises(ApiException) as error:
        _create(kube, namespace, _job("bad", template))
    assert error.value.status == 422, error.value.body
    causes = json.loads(error.value.body)["details"]["causes"]
    # The API server names the entry, or the list or map holding it (where the CEL rule sits).
    assert any(c.get("field", "").startswith("spec.podTemplate") and message in c.get("message", "")
               for c in causes), causes


def test_admission_accepts_a_platform_template(kube: Kube, namespace: str, install_crds: list[str]) -> None:
    from test_pod_template_lifecycle import platform_template

    created = _create(kube, namespace, _job("platform", platform_template()))
    assert created["spec"]["podTemplate"] == platform_template()

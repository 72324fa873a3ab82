"""The real API server refuses, through the CRD's CEL rules, every job with its own container that memfit
could not plan as the script runs (memfit_testbed.own_code_cases, shared with the operator's own rules), in
the operator's words, and accepts the example."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.own_code_cases import REFUSED

pytestmark = pytest.mark.cluster
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own-code.yaml"


def _create(kube: Kube, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    doc = {"apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": name},
           "spec": spec}
    result: dict[str, Any] = client.CustomObjectsApi(kube.api_client).create_namespaced_custom_object(
        "memfit.dev", "v1alpha1", namespace, "memoryoptimizedtrainingjobs", doc)
    return result


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_admission_refuses_a_job_its_script_would_not_run_as_planned(
    kube: Kube, namespace: str, install_crds: list[str], case: str
) -> None:
    spec, field, message = REFUSED[case]
    with pytest.raises(ApiException) as error:
        _create(kube, namespace, "bad", spec)
    assert error.value.status == 422, error.value.body
    causes = json.loads(error.value.body)["details"]["causes"]
    where = field.split("[")[0]
    assert any(message in c.get("message", "") and where.startswith(c.get("field", "").split("[")[0])
               for c in causes), causes


def test_admission_accepts_the_example(kube: Kube, namespace: str, install_crds: list[str]) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    created = _create(kube, namespace, doc["metadata"]["name"], doc["spec"])
    assert created["spec"]["container"]["honors"] == doc["spec"]["container"]["honors"]

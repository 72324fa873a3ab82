"""spec.podTemplate: what a platform may add to every pod is accepted; each field memfit owns is refused,
naming the field, by the operator's rules (the CRD's CEL rules say the same: tests/integration)."""

from __future__ import annotations

from typing import Any

import pytest
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pod_template_rules import check_pod_template
from memfit.api.rules import check_spec
from memfit_testbed.pod_template_cases import REFUSED
from pydantic import ValidationError

PROBLEM = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}}

PLATFORM_TEMPLATE: dict[str, Any] = {
    "labels": {"team": "vision", "app.kubernetes.io/part-of": "research"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
            {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
            {"name": "MEMFIT_SEED", "value": "7"}],
    "envFrom": [{"configMapRef": {"name": "nccl-settings"}}],
    "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
                {"name": "ca", "configMap": {"name": "corp-ca"}}],
    "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True},
                     {"name": "ca", "mountPath": "/etc/ssl/corp"}],
    "serviceAccountName": "trainer-wandb",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "tolerations": [{"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}],
    "nodeSelector": {"topology.kubernetes.io/zone": "zone-a"},
    "initContainers": [{"name": "wait-for-data", "image": "busybox:1.36", "command": ["sh", "-c", "true"],
                        "volumeMounts": [{"name": "datasets", "mountPath": "/data"}]}],
    "sidecars": [{"name": "log-shipper", "image": "fluent-bit:3",
                  "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
}


def spec_with(template: dict[str, Any]) -> dict[str, Any]:
    return {"problem": PROBLEM, "podTemplate": template}


def test_a_platform_template_is_accepted_whole() -> None:
    assert check_pod_template(spec_with(PLATFORM_TEMPLATE)) == []
    spec = MemoryOptimizedTrainingJobSpec.model_validate(spec_with(PLATFORM_TEMPLATE))
    assert spec.pod_template is not None and spec.pod_template.to_wire() == PLATFORM_TEMPLATE


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_template_touching_what_memfit_owns_is_refused_naming_the_field(case: str) -> None:
    template, path, message = REFUSED[case]
    findings = check_pod_template(spec_with(template))
    assert [p for p, _ in findings] == [path], findings
    assert findings[0][1].startswith(message)
    # The operator's own parse refuses it in the same words (the CRD's CEL rules say it at admission).
    with pytest.raises(ValidationError, match=r"spec\.podTemplate"):
        MemoryOptimizedTrainingJobSpec.model_validate(spec_with(template))
    assert path in [p for p, _ in check_spec(spec_with(template))]


def test_host_path_volumes_are_not_part_of_the_api() -> None:
    with pytest.raises(ValidationError, match="hostPath"):
        MemoryOptimizedTrainingJobSpec.model_validate(
            spec_with({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}))


def test_selector_conflicts_name_the_contradicted_terms() -> None:
    spec = MemoryOptimizedTrainingJobSpec.model_validate(
        spec_with({"nodeSelector": {"zone": "a", "team": "vision"}}))
    assert spec.pod_template is not None
    assert spec.pod_template.selector_conflicts({"zone": "b", "gpu": "h100"}) == ["zone=a"]
    assert spec.pod_template.selector_conflicts({"zone": "a"}) == []

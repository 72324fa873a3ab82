"""spec.podTemplate end to end: the real API server accepts the job and the Job controller's pods, the local
pod runner runs the platform's init container (which checks that the template's env, envFrom and mounted
ConfigMap reached it) and its native sidecar beside memfit's profiler and trainer, and the job Succeeds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 420.0
NAME = "pod-template"

# Exits 3 unless the template's variable, the ConfigMap's key (envFrom) and the mounted file all arrived.
CHECK = ("import os, sys; ok = os.environ.get('TEAM') == 'vision' and os.environ.get('TRACKER_MODE') == "
         "'offline' and open('/etc/team/ca.pem').read() == 'corp-ca'; sys.exit(0 if ok else 3)")


@pytest.fixture(scope="module")
def operator(cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[tuple[Path, int]]:
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, port):
        yield log, port


def platform_template() -> dict[str, Any]:
    return {
        "labels": {"team": "vision"},
        "annotations": {"example.com/cost-center": "ml-42"},
        "env": [{"name": "TEAM", "value": "vision"}],
        "envFrom": [{"configMapRef": {"name": "tracker-settings"}}],
        "volumes": [{"name": "team-ca", "configMap": {"name": "team-ca"}}],
        "volumeMounts": [{"name": "team-ca", "mountPath": "/etc/team", "readOnly": True}],
        "serviceAccountName": "trainer-tracker",
        "initContainers": [{"name": "check-settings", "image": "python:3.11-slim", "command": ["python", "-c", CHECK],
                            "volumeMounts": [{"name": "team-ca", "mountPath": "/etc/team", "readOnly": True}]}],
        "sidecars": [{"name": "tracker", "image": "python:3.11-slim",
                      "command": ["python", "-c", "import time; time.sleep(86400)"]}],
    }


def test_the_template_reaches_the_profiling_and_training_pods_and_the_job_succeeds(
    kube: Kube, namespace: str, operator: tuple[Path, int]
) -> None:
    log, _ = operator
    core = kube.core
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "tracker-settings"},
                                                  "data": {"TRACKER_MODE": "offline"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "team-ca"}, "data": {"ca.pem": "corp-ca"}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer-tracker"},
                                                       "automountServiceAccountToken": False})
    create_job(kube, namespace, quickstart(NAME, podTemplate=platform_template(), profiling={"reuse": False}))
    job = wait_phase(kube, namespace, NAME, ("Succeeded", "Failed"), TIMEOUT, log)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    for component, main in (("profiler", "profiler"), ("trainer", "trainer")):
        pods = kube.pods(namespace, f"memfit.dev/job={NAME},memfit.dev/component={component}")
        assert pods, component
        for pod in pods:
            assert pod["status"]["phase"] == "Succeeded", (component, pod["status"])
            meta, spec = pod["metadata"], pod["spec"]
            assert meta["labels"]["team"] == "vision" and meta["labels"]["memfit.dev/job"] == NAME
            assert meta["annotations"]["example.com/cost-center"] == "ml-42"
            assert spec["serviceAccountName"] == "trainer-tracker"
            assert [c["name"] for c in spec["initContainers"]][:2] == ["tracker", "check-settings"]
            assert spec["initContainers"][0]["restartPolicy"] == "Always"
            statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
            assert statuses["check-settings"]["state"]["terminated"]["exitCode"] == 0
            container = next(c for c in spec["containers"] if c["name"] == main)
            assert {"name": "TEAM", "value": "vision"} in container["env"]
            assert {"configMapRef": {"name": "tracker-settings"}} in container["envFrom"]
            assert any(m["mountPath"] == "/etc/team" for m in container["volumeMounts"])
            assert container["resources"]["limits"]["nvidia.com/gpu"]  # memfit's request stands

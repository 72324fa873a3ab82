"""Security: pods are non-root and restricted whatever the spec says, stay in the job's namespace, and
no secret reaches the operator's logs or the objects it writes."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml
from chaos import GROUP, MOTJ, VERSION, ChaosCluster, operator_for, quickstart, seed_profile, stop_checked
from hypothesis import given, settings
from kubernetes import client
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.controller.planning import plan_job
from memfit.kube.common import Owner, Placement, PodSettings
from memfit.kube.profile_job import build_profile_job
from memfit.kube.train_job import build_training_job
from memfit.memory.problems import shape_from_problem
from security import dump, find_secrets, pod_violations, valid_specs

REPO = Path(__file__).resolve().parents[2]
POOLS = [
    GPUNodePool.model_validate(d)
    for d in yaml.safe_load_all((REPO / "examples" / "gpunodepools.yaml").read_text())
    if d
]
OWNER = Owner(name="job", namespace="team-a", uid="uid-1")
POD = PodSettings(image="memfit-trainer:1")
CANARIES = ["hf_canaryTOKEN0000000000000000000000", "AKIACANARY0000000000", "canary-secret-value-8d1f"]


@settings(max_examples=80, deadline=None)
@given(raw=valid_specs())
def test_every_pod_memfit_builds_is_restricted_and_stays_in_the_namespace(raw: dict[str, object]) -> None:
    spec = MemoryOptimizedTrainingJobSpec.model_validate(raw)
    profile = Profile(problem_hash="h", shape=shape_from_problem(spec.problem))
    outcome = plan_job(
        spec=spec,
        profile=profile,
        pools=POOLS,
        capacity={},
        excluded_pools=frozenset(),
        observations=(),
        attempt=0,
        job_name=OWNER.name,
    )
    assert outcome.plan is not None, outcome.message()  # tiny model: fits every pool
    pool = next(p for p in POOLS if p.metadata.name == outcome.plan.node_pool)
    placement = Placement(pool.metadata.name, dict(pool.spec.node_selector), tuple(pool.spec.tolerations))
    train = build_training_job(owner=OWNER, spec=spec, plan=outcome.plan, placement=placement, pod=POD)
    profile_job = build_profile_job(
        owner=OWNER, problem_hash="h", placement=placement, pod=POD, timeout_seconds=600
    )
    assert pod_violations(train, namespace=OWNER.namespace) == []
    assert pod_violations(profile_job, namespace=OWNER.namespace) == []


def test_operator_rbac_has_no_secrets() -> None:
    rules = (REPO / "charts" / "memfit" / "templates" / "_rbac.tpl").read_text()
    resources = [line for line in rules.splitlines() if "resources:" in line]
    assert resources and not [r for r in resources if "secret" in r.lower()]


@pytest.mark.cluster
@pytest.mark.slow
def test_restricted_namespace_runs_jobs_and_nothing_leaks(
    chaos_cluster: ChaosCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job in a `restricted` Pod Security namespace runs (its pods are admitted); canary secrets in
    the operator's environment and in a Secret of the namespace appear in no log and no object."""
    kube = chaos_cluster.kube
    namespace = f"restricted-{int(time.time())}"
    kube.core.create_namespace(
        {
            "metadata": {
                "name": namespace,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            }
        }
    )
    kube.wait(
        "default ServiceAccount",
        lambda: kube.raw(kube.core.read_namespaced_service_account, "default", namespace),
        60,
    )
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "canary"}, "stringData": {"token": CANARIES[2]}}
    )
    monkeypatch.setenv("HF_TOKEN", CANARIES[0])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CANARIES[1])
    op = operator_for(chaos_cluster, namespace, tmp_path / "operator.log", extra=("--verbose",))
    try:
        seed_profile(chaos_cluster.api, namespace, quickstart("seed"))
        custom = client.CustomObjectsApi(kube.api_client)
        for name, extra in (
            ("cached", {}),
            ("profiled", {"profiling": {"reuse": False, "timeoutSeconds": 300}}),
        ):
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, quickstart(name, **extra))
        kube.wait(
            "both jobs Succeeded",
            lambda: all(
                (
                    custom.get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, n).get("status")
                    or {}
                ).get("phase")
                == "Succeeded"
                for n in ("cached", "profiled")
            ),
            120,
        )
    finally:
        stop_checked(op)
    pods = kube.pods(namespace, "app.kubernetes.io/managed-by=memfit")
    jobs = (kube.raw(kube.batch.list_namespaced_job, namespace) or {}).get("items", [])
    assert len(pods) >= 3 and len(jobs) == 3  # profiler + 2 trainers, admitted by `restricted`
    for obj in [*pods, *jobs]:
        assert pod_violations(obj, namespace=namespace) == []
    kubeconfig = yaml.safe_load(chaos_cluster.kubeconfig.read_text())
    user = kubeconfig["users"][0]["user"]
    key_pem = base64.b64decode(user["client-key-data"]).decode()
    credentials = [user["client-key-data"][:40], *[line for line in key_pem.splitlines()[1:3]]]
    written = dump(
        [
            (kube.raw(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, MOTJ) or {}).get(
                "items"
            ),
            (kube.raw(kube.core.list_namespaced_config_map, namespace) or {}).get("items"),
            (kube.raw(kube.core.list_namespaced_event, namespace) or {}).get("items"),
            jobs,
            pods,
        ]
    )
    assert find_secrets(written, CANARIES + credentials) == []
    assert find_secrets(op.log_path.read_text(), CANARIES + credentials) == []

"""The reconcile function itself against the real API server (no operator process running):
idempotence, invalid specs, NoFit with per-pool reasons, the plan ConfigMap as the record of a decision."""

from __future__ import annotations

import copy
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from memfit.controller.kubeapi import KubeApi
from memfit.controller.reconcile import reconcile_job
from memfit.controller.settings import OperatorSettings
from memfit.controller.watched_jobs import WatchedJobs
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import GROUP, VERSION, apply_pools, create_job, get_job, quickstart
from memfit_testbed.profiles import seed_profile
from prometheus_client import REGISTRY

pytestmark = pytest.mark.cluster
SETTINGS = OperatorSettings(trainer_image="memfit-trainer:test")


@pytest.fixture
def api(kube: Kube, install_crds: list[str]) -> KubeApi:
    apply_pools(kube)
    return KubeApi.from_client(kube.api_client)


def children(kube: Kube, namespace: str) -> dict[str, str]:
    """name -> resourceVersion of every Job, ConfigMap and Service memfit made in the namespace."""
    out: dict[str, str] = {}
    for item in kube.batch.list_namespaced_job(namespace).items:
        out[f"job/{item.metadata.name}"] = item.metadata.resource_version
    for item in kube.core.list_namespaced_config_map(
        namespace, label_selector="app.kubernetes.io/managed-by=memfit"
    ).items:
        out[f"cm/{item.metadata.name}"] = item.metadata.resource_version
    for item in kube.core.list_namespaced_service(namespace).items:
        out[f"svc/{item.metadata.name}"] = item.metadata.resource_version
    return out


def test_second_reconcile_writes_nothing(kube: Kube, namespace: str, api: KubeApi) -> None:
    create_job(kube, namespace, quickstart("idem"))
    first = reconcile_job(api, get_job(kube, namespace, "idem"), settings=SETTINGS)  # type: ignore[arg-type]
    assert first is not None and first.status["phase"] == "Profiling"
    body = get_job(kube, namespace, "idem")
    assert body is not None
    before = (body["metadata"]["resourceVersion"], children(kube, namespace))
    assert "job/idem-profile" in before[1] and "cm/idem-profile" in before[1]
    assert reconcile_job(api, body, settings=SETTINGS) is None
    after = get_job(kube, namespace, "idem")
    assert after is not None
    assert (after["metadata"]["resourceVersion"], children(kube, namespace)) == before


def test_cached_profile_goes_straight_to_launch(kube: Kube, namespace: str, api: KubeApi) -> None:
    doc = quickstart("cached")
    seed_profile(api, namespace, doc)
    create_job(kube, namespace, doc)
    plans_before = REGISTRY.get_sample_value("memfit_plan_duration_seconds_count") or 0.0
    decision = reconcile_job(api, get_job(kube, namespace, "cached"), settings=SETTINGS)  # type: ignore[arg-type]
    assert decision is not None and decision.status["phase"] == "Launching"
    assert (
        REGISTRY.get_sample_value("memfit_plan_duration_seconds_count") == plans_before + 1
    )  # planner timed
    made = children(kube, namespace)
    assert {"cm/cached-plan-0", "job/cached-train-0", "svc/cached"} <= set(made)
    assert "job/cached-profile" not in made
    assert decision.status["profile"]["source"] == "cached"
    reasons = [reason for _, reason, _ in decision.events]
    assert reasons == ["ProfileCached", "PlanFound"]
    # The plan ConfigMap is the record of the decision: a second reconcile neither re-plans nor makes
    # children. It may only report progress: KWOK can start the training pod in between (seen under
    # load), and Launching -> Running is a status update, not a second decision.
    again = reconcile_job(api, get_job(kube, namespace, "cached"), settings=SETTINGS)  # type: ignore[arg-type]
    if again is not None:
        assert [reason for _, reason, _ in again.events if reason in {"PlanFound", "ProfileCached"}] == []
        assert again.status["phase"] in {"Launching", "Running"}
        assert again.status.get("plan") in (None, decision.status["plan"])
    assert children(kube, namespace) == made


def test_invalid_spec_fails_without_children(kube: Kube, namespace: str, api: KubeApi) -> None:
    create_job(kube, namespace, quickstart("invalid"))
    body = get_job(kube, namespace, "invalid")
    assert body is not None
    bad = copy.deepcopy(body)  # as an older CRD without the CEL rules would have stored it
    bad["spec"]["strategy"] = {"engine": "ddp", "zeroStage": 3}
    decision = reconcile_job(api, bad, settings=SETTINGS)
    assert decision is not None
    failed = next(c for c in decision.status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "spec.strategy.zeroStage" in failed["message"]
    assert children(kube, namespace) == {}


def test_no_fit_reports_a_reason_per_pool(kube: Kube, namespace: str, api: KubeApi) -> None:
    doc = quickstart(
        "huge",
        placement={"maxNodes": 1, "baseline": {"nodePool": "a100-80-ondemand"}},
        strategy={"precision": "fp32", "offload": "none", "activationCheckpointing": "none"},
    )
    doc["spec"]["problem"] = {
        "builtin": {
            "kind": "gpt",
            "layers": 80,
            "hidden": 8192,
            "heads": 64,
            "vocab": 32000,
            "sequenceLength": 4096,
        }
    }
    seed_profile(api, namespace, doc)
    create_job(kube, namespace, doc)
    decision = reconcile_job(api, get_job(kube, namespace, "huge"), settings=SETTINGS)  # type: ignore[arg-type]
    assert decision is not None and decision.status["phase"] == "Failed"
    failed = next(c for c in decision.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NoFit"
    for pool in ("t4-spot", "l4-ondemand", "a100-80-ondemand"):
        assert pool in failed["message"]
    assert not [k for k in children(kube, namespace) if k.startswith("job/huge-train")]


def test_pool_status_from_nodes(kube: Kube, api: KubeApi) -> None:
    from memfit.controller.pool_status import reconcile_pools

    reconcile_pools(api)
    pool = client.CustomObjectsApi(kube.api_client).get_cluster_custom_object(
        GROUP, VERSION, "gpunodepools", "l4-ondemand"
    )
    assert pool["status"]["nodes"] == 2 and pool["status"]["readyNodes"] == 2
    assert pool["status"]["allocatableGpus"] == 8
    assert 0 <= pool["status"]["freeGpus"] <= 8


def test_waits_for_capacity_instead_of_failing(kube: Kube, namespace: str, api: KubeApi) -> None:
    """Every allowed GPU is busy but the job would fit: it waits (like a queue), then launches."""
    for i in range(2):
        kube.core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": f"busy-{i}"},
                "spec": {
                    "nodeSelector": {"memfit.dev/pool": "t4-spot"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                },
            },
        )
    for i in range(2):
        kube.wait_pod_phase(namespace, f"busy-{i}", ("Running",), timeout=60)
    doc = quickstart("waiter", placement={"nodePools": ["t4-spot"], "maxNodes": 1})
    seed_profile(api, namespace, doc)
    create_job(kube, namespace, doc)
    decision = reconcile_job(api, get_job(kube, namespace, "waiter"), settings=SETTINGS)  # type: ignore[arg-type]
    assert decision is not None and decision.status["phase"] == "Planning"
    planned = next(c for c in decision.status["conditions"] if c["type"] == "Planned")
    assert planned["reason"] == "WaitingForCapacity" and "t4-spot" in planned["message"]
    assert not [k for k in children(kube, namespace) if k.startswith("job/waiter")]
    for i in range(2):
        kube.core.delete_namespaced_pod(
            f"busy-{i}", namespace, body=client.V1DeleteOptions(grace_period_seconds=0)
        )
    kube.wait("busy pods gone", lambda: not kube.pods(namespace, ""), timeout=60)
    decision = reconcile_job(api, get_job(kube, namespace, "waiter"), settings=SETTINGS)  # type: ignore[arg-type]
    assert decision is not None and decision.status["phase"] == "Launching"
    assert "job/waiter-train-0" in children(kube, namespace)


def test_kueue_queue_creates_the_job_suspended(kube: Kube, namespace: str, api: KubeApi) -> None:
    doc = quickstart("queued", scheduling={"kueueQueue": "team-a"})
    seed_profile(api, namespace, doc)
    create_job(kube, namespace, doc)
    reconcile_job(api, get_job(kube, namespace, "queued"), settings=SETTINGS)  # type: ignore[arg-type]
    job = kube.batch.read_namespaced_job("queued-train-0", namespace)
    assert job.spec.suspend is True
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "team-a"
    decision = reconcile_job(api, get_job(kube, namespace, "queued"), settings=SETTINGS)  # type: ignore[arg-type]
    assert decision is not None
    running = next(c for c in decision.status["conditions"] if c["type"] == "Running")
    assert running["reason"] == "WaitingForAdmission" and "team-a" in running["message"]
    assert not kube.pods(namespace, "memfit.dev/job=queued")  # nothing runs before admission


def test_unschedulable_profiling_pod_is_placed_again(kube: Kube, namespace: str, api: KubeApi) -> None:
    """The profiling pool filled up after placement: the profiling Job is deleted and placed again."""
    doc = quickstart("resched", recovery={"maxReplans": 1, "capacityTimeoutSeconds": 10})
    create_job(kube, namespace, doc)
    reconcile_job(api, get_job(kube, namespace, "resched"), settings=SETTINGS)  # type: ignore[arg-type]
    job = kube.batch.read_namespaced_job("resched-profile", namespace)
    # Simulate the capacity change: make the pod unschedulable by pinning it to a pool that does not exist.
    kube.batch.delete_namespaced_job(
        "resched-profile",
        namespace,
        propagation_policy="Foreground",
        body=client.V1DeleteOptions(grace_period_seconds=0, propagation_policy="Foreground"),
    )
    kube.wait(
        "old profiling Job gone",
        lambda: not [j for j in kube.batch.list_namespaced_job(namespace).items],
        timeout=60,
    )
    manifest = kube.api_client.sanitize_for_serialization(job)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        manifest["metadata"].pop(key, None)
    manifest.pop("status", None)
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"memfit.dev/pool": "no-such-pool"}
    for key in ("selector",):
        manifest["spec"].pop(key, None)
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    for key in (
        "batch.kubernetes.io/controller-uid",
        "controller-uid",
        "batch.kubernetes.io/job-name",
        "job-name",
    ):
        labels.pop(key, None)
    kube.batch.create_namespaced_job(namespace, manifest)

    def unschedulable() -> bool:
        pods = kube.pods(namespace, "memfit.dev/job=resched")
        return any(
            c.get("reason") == "Unschedulable" for p in pods for c in p["status"].get("conditions") or []
        )

    kube.wait("profiling pod unschedulable", unschedulable, timeout=60)
    time.sleep(11)
    decision = reconcile_job(api, get_job(kube, namespace, "resched"), settings=SETTINGS)  # type: ignore[arg-type]
    assert decision is not None
    assert any(reason == "ProfilingRescheduled" for _, reason, _ in decision.events)

    def replaced() -> bool:
        reconcile_job(api, get_job(kube, namespace, "resched"), settings=SETTINGS)  # type: ignore[arg-type]
        try:
            current = kube.batch.read_namespaced_job("resched-profile", namespace)
        except client.exceptions.ApiException:
            return False
        return current.spec.template.spec.node_selector != {"memfit.dev/pool": "no-such-pool"}

    kube.wait("profiling Job placed again", replaced, timeout=90, interval=1)


def test_status_costs_survive_a_restart_of_the_reconcile(kube: Kube, namespace: str, api: KubeApi) -> None:
    """Baseline, estimated cost and savings are kept by a reconcile that starts from the stored status
    (a fresh API client and settings, as after an operator restart), and rebuilt from the stored Plan
    when the status lost its plan summary (seen: `Estimated Cost: 0`, `Baseline Cost: 0`)."""
    doc = quickstart("restart")
    seed_profile(api, namespace, doc)
    create_job(kube, namespace, doc)
    first = reconcile_job(api, get_job(kube, namespace, "restart"), settings=SETTINGS)  # type: ignore[arg-type]
    assert first is not None and first.status["phase"] == "Launching"
    stored = get_job(kube, namespace, "restart")
    assert stored is not None
    plan = stored["status"]["plan"]
    # A tiny job's cost is a few millionths of a dollar: kept, not rounded to 0.
    assert plan["estimatedCost"] > 0 and plan["baselineCost"] > 0 and plan["declaredBaselineCost"] > 0
    assert plan["baseline"].startswith("plain ") and plan["declaredBaseline"].startswith("declared: plain ")
    assert plan["savingsPercent"] >= 0 and plan["declaredSavingsPercent"] > 0
    assert plan["savings"] == "same cost" or plan["savings"].startswith("saves ")

    # "Restart": a new client and settings object, nothing carried over but what the API server holds.
    restarted = KubeApi.from_client(client.ApiClient(kube.api_client.configuration))
    settings = OperatorSettings(trainer_image="memfit-trainer:test")
    reconcile_job(restarted, get_job(kube, namespace, "restart"), settings=settings)  # type: ignore[arg-type]
    after = get_job(kube, namespace, "restart")
    assert after is not None and after["status"]["plan"] == plan

    # The status lost its plan summary (an older operator, a hand edit): rebuilt from the stored Plan.
    custom = client.CustomObjectsApi(kube.api_client)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "memoryoptimizedtrainingjobs", "restart", {"status": {"plan": None}}
    )
    lost = get_job(kube, namespace, "restart")
    assert lost is not None and lost["status"].get("plan") is None
    reconcile_job(restarted, lost, settings=settings)
    rebuilt = get_job(kube, namespace, "restart")
    assert rebuilt is not None and rebuilt["status"]["plan"] == plan


def test_kube_api_requests_speak_plain_json_and_raise_the_servers_status(namespace: str, api: KubeApi) -> None:
    """KubeApi's own requests (no generated client methods): a created Job is kept for the next pass,
    reads answer dicts or None, a selector travels encoded, and an error keeps the server's status."""
    api.watched_jobs = WatchedJobs()
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "plain", "namespace": namespace, "labels": {"memfit.dev/job": "plain"}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                        "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    created, fresh = api.ensure(job)
    assert fresh and created["metadata"]["uid"]
    assert api.watched_jobs.get(namespace, "plain") is not None  # no GET for the next pass
    again, fresh = api.ensure(job)  # 409: the existing one, read back
    assert not fresh and again["metadata"]["uid"] == created["metadata"]["uid"]
    assert api.get_config_map(namespace, "no-such-map") is None
    assert api.list_pods(namespace, "memfit.dev/job=plain,memfit.dev/attempt in (0,1)") == []
    with pytest.raises(ApiException) as raised:
        api.patch_motj_status(namespace, "no-such-job", {"phase": "Running"}, "1")
    assert raised.value.status == 404

"""Gang admission through the real Kueue: a plan over two nodes is admitted whole or not at all, and
with WaitForPodsReady a gang whose pods do not all become ready is evicted and requeued by Kueue while
memfit keeps its attempt.

memfit's training Job for a two-node plan is one Indexed Job (parallelism 2, one pod per node), so Kueue
sees one Workload with a pod set of count 2 and reserves quota for both pods or neither; memfit asks for
no partial admission (no `kueue.x-k8s.io/job-min-parallelism`). The pods here are simulated by KWOK (the
operator runs without the local pod runner): the model is far too large for this machine, and only the
admission is under test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kueue_helpers import admitted, delete, gpu_flavor, patch_cluster_queue, set_gpu_quota, setup, workload_of
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.kueue import KueueManager
from memfit_testbed.operator_helpers import apply_pools, create_job, get_job, operator_process, quickstart
from operator_ready import wait_healthy

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
KUEUE_PODS_READY_TIMEOUT = 15  # WaitForPodsReady on for this module's Kueue (tests/conftest.py)
T4 = {"memfit.dev/pool": "t4-spot"}
# A 1.3B-parameter GPT: its ZeRO-3 states (~21 GB in fp16 with fp32 master weights and Adam) need the
# two T4s of t4-spot (15 GB each); with the strategy pinned, no single-GPU plan exists.
BIG = {"builtin": {"kind": "gpt", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 50304, "sequenceLength": 512}}


@pytest.fixture(scope="module")
def operator(
    cluster: Any, kube: Kube, kueue: KueueManager, tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Path]:
    request.getfixturevalue("install_crds")
    apply_pools(kube)
    log = tmp_path_factory.mktemp("operator-kwok") / "operator.log"
    with operator_process(cluster.kubeconfig, log, pod_runner=False) as (proc, port):
        wait_healthy(port, log)
        yield log
        assert proc.poll() is None, f"operator exited:\n{log.read_text()[-3000:]}"


def test_a_two_node_plan_is_admitted_whole_or_not_at_all(kube: Kube, namespace: str, operator: Path) -> None:
    from memfit.controller.kubeapi import KubeApi
    from memfit_testbed.profiles import seed_profile

    docs = setup(namespace, {"t4-spot": 2})
    cq = f"cq-{namespace}"
    try:
        patch_cluster_queue(kube, cq, {"spec": {"stopPolicy": "Hold"}})  # memfit plans against 2 free GPUs
        spec = quickstart("gang", problem=BIG, scheduling={"kueueQueue": "gpu"},
                          training={"globalBatchSize": 8, "maxSteps": 10},
                          strategy={"engine": "deepspeed", "zeroStage": 3, "offload": "none", "precision": "fp16"},
                          placement={"nodePools": ["t4-spot"], "maxNodes": 2,
                                     "baseline": {"nodePool": "a100-80-ondemand", "nodes": 1}})  # fmt: skip
        seed_profile(KubeApi.from_client(kube.api_client), namespace, spec)
        create_job(kube, namespace, spec)
        train = kube.wait("the training Job", lambda: kube.batch.read_namespaced_job("gang-train-0", namespace)
                          if any(j.metadata.name == "gang-train-0" for j in kube.batch.list_namespaced_job(
                              namespace).items) else None, timeout=90)  # fmt: skip
        # The status is patched after the Job is created: wait for it, not for the Job alone.
        plan = kube.wait("the plan in the job's status", lambda: (get_job(kube, namespace, "gang").get("status")
                                                                   or {}).get("plan"), timeout=60)
        assert (plan["nodePool"], plan["nodes"], plan["gpus"]) == ("t4-spot", 2, 2), plan
        assert train.spec.parallelism == 2 and train.spec.completions == 2
        annotations = train.metadata.annotations or {}
        assert "kueue.x-k8s.io/job-min-parallelism" not in annotations  # no partial admission

        # The queue can now hold one of the two GPUs: nothing is admitted, no pod exists.
        set_gpu_quota(kube, cq, {"t4-spot": 1}, stopPolicy="None")
        wl = kube.wait("the Workload pending for quota", lambda: _pending(kube, namespace), timeout=60)
        assert wl["spec"]["podSets"][0]["count"] == 2, wl["spec"]["podSets"]
        assert kube.batch.read_namespaced_job("gang-train-0", namespace).spec.suspend is True
        assert not kube.pods(namespace, "job-name=gang-train-0")

        # Quota for both: admitted as one, both pods created on the pool's flavor.
        set_gpu_quota(kube, cq, {"t4-spot": 2})
        wl = kube.wait("the Workload admitted", lambda: admitted(kube, namespace, "gang-train-0"), timeout=90)
        assert gpu_flavor(wl) == "t4-spot"
        assert wl["status"]["admission"]["podSetAssignments"][0]["count"] == 2
        pods = kube.wait("both pods", lambda: p if len(p := kube.pods(namespace, "job-name=gang-train-0")) == 2
                         else None, timeout=60)  # fmt: skip
        assert all(p["spec"]["nodeSelector"] == T4 for p in pods)
    finally:
        delete(docs[-2:])


def _cordon(kube: Kube, node: str, unschedulable: bool) -> None:
    kube.core.patch_node(node, {"spec": {"unschedulable": unschedulable}})


def _evicted_for_readiness(kube: Kube, namespace: str, job: str) -> dict[str, Any] | None:
    wl = workload_of(kube, namespace, job)
    count = (((wl or {}).get("status") or {}).get("requeueState") or {}).get("count") or 0
    return wl if count >= 1 else None


def test_a_gang_whose_pods_are_not_ready_is_requeued_by_kueue_and_memfit_keeps_the_attempt(
    kube: Kube, namespace: str, operator: Path
) -> None:
    """WaitForPodsReady (timeout 15 s): the two-node plan is admitted, but the t4-spot nodes were cordoned
    after memfit planned, so its pods cannot schedule. Kueue evicts the Workload (PodsReadyTimeout),
    suspends the Job and requeues it, again and again; memfit neither fails nor re-plans the attempt (its
    capacity timeout is 600 s), and the same Job runs both pods once the nodes are back. (KWOK completes a
    pod at once, so with one node left the two pods would simply run one after the other.)"""
    from memfit.controller.kubeapi import KubeApi
    from memfit_testbed.profiles import seed_profile

    docs = setup(namespace, {"t4-spot": 2})
    cq = f"cq-{namespace}"
    nodes = sorted(n.metadata.name for n in kube.core.list_node(label_selector="memfit.dev/pool=t4-spot").items)
    assert len(nodes) == 2, nodes
    try:
        patch_cluster_queue(kube, cq, {"spec": {"stopPolicy": "Hold"}})
        spec = quickstart("ready", problem=BIG, scheduling={"kueueQueue": "gpu"},
                          training={"globalBatchSize": 8, "maxSteps": 10},
                          strategy={"engine": "deepspeed", "zeroStage": 3, "offload": "none", "precision": "fp16"},
                          recovery={"capacityTimeoutSeconds": 600},
                          placement={"nodePools": ["t4-spot"], "maxNodes": 2,
                                     "baseline": {"nodePool": "a100-80-ondemand", "nodes": 1}})  # fmt: skip
        seed_profile(KubeApi.from_client(kube.api_client), namespace, spec)
        create_job(kube, namespace, spec)
        kube.wait("the training Job", lambda: [j for j in kube.batch.list_namespaced_job(namespace).items
                                               if j.metadata.name == "ready-train-0"] or None, timeout=90)
        for node in nodes:
            _cordon(kube, node, True)
        patch_cluster_queue(kube, cq, {"spec": {"stopPolicy": "None"}})
        kube.wait("the Workload admitted", lambda: admitted(kube, namespace, "ready-train-0"), timeout=60)
        wl = kube.wait("Kueue evicts it for PodsReadyTimeout and requeues it",
                       lambda: _evicted_for_readiness(kube, namespace, "ready-train-0"), timeout=90)
        evicted = [c for c in wl["status"]["conditions"] if c["type"] == "Evicted"]
        assert not evicted or evicted[0]["reason"] == "PodsReadyTimeout", evicted

        status = get_job(kube, namespace, "ready")["status"]
        assert status["phase"] in ("Launching", "Running"), status
        assert [a["outcome"] for a in status["attempts"]] == ["Launching"], status["attempts"]  # not ended
        names = [j.metadata.name for j in kube.batch.list_namespaced_job(namespace).items]
        assert "ready-train-1" not in names, names

        for node in nodes:
            _cordon(kube, node, False)

        def both_ran() -> list[dict[str, Any]] | None:
            pods = [p for p in kube.pods(namespace, "job-name=ready-train-0")
                    if (p.get("status") or {}).get("phase") in ("Running", "Succeeded")]
            return pods if len(pods) == 2 else None

        pods = kube.wait("both pods of the same Job run once the nodes are back", both_ran, timeout=120)
        assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
        status = get_job(kube, namespace, "ready")["status"]
        assert len(status["attempts"]) == 1, status["attempts"]
        names = [j.metadata.name for j in kube.batch.list_namespaced_job(namespace).items]
        assert "ready-train-1" not in names, names
    finally:
        for node in nodes:
            _cordon(kube, node, False)
        delete(docs[-2:])


def _pending(kube: Kube, namespace: str) -> dict[str, Any] | None:
    wl = workload_of(kube, namespace, "gang-train-0")
    conds = {c["type"]: c for c in ((wl or {}).get("status") or {}).get("conditions") or []}
    reserved = conds.get("QuotaReserved")
    if reserved and reserved["status"] == "False" and "insufficient" in reserved.get("message", ""):
        return wl
    return None

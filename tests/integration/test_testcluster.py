"""The test cluster is real: scheduler, KWOK GPU pools, PodSecurity, Jobs and the local pod runner."""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from memfit_testbed import kwok_pools
from memfit_testbed.cluster_helpers import Kube, condition, terminated
from memfit_testbed.pod_runner import SIMULATED_ANNOTATION, selector_matches, simulate_pods

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SCRIPTS = Path(__file__).resolve().parent / "scripts"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
RUN_LOCAL = {"memfit.dev/run-local": "true"}
CPU_POOL = {"memfit.dev/pool": "cpu-ondemand"}


def gpu_pod(name: str, pool: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"memfit.dev/pool": pool},
            "tolerations": [GPU_TOLERATION],
            "containers": [{"name": "main", "image": "memfit/fake:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
    }


def local_pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """A bare pod run by the local pod runner: `python -c code`."""
    return {
        "metadata": {"name": name, "labels": {**RUN_LOCAL, "app": "t"},
                     "annotations": {"memfit.dev/note": "hello"}},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": CPU_POOL,
            "containers": [{"name": "main", "image": "memfit/trainer:local",
                            "command": ["python", "-c", code], **spec}],
        },
    }


def test_pools_from_the_fixture(kube: Kube) -> None:
    pools = kwok_pools.load_pools()
    assert len([p for p in pools.values() if p.gpu]) >= 3
    for pool in pools.values():
        nodes = kube.core.list_node(label_selector=f"memfit.dev/pool={pool.name}").items
        assert len(nodes) == pool.nodes
        for n in nodes:
            labels, alloc = n.metadata.labels, n.status.allocatable
            assert labels["node.kubernetes.io/instance-type"] == pool.instance_type
            assert labels["karpenter.sh/capacity-type"] == pool.capacity_type
            ready = condition(kube.raw(kube.core.read_node, n.metadata.name) or {}, "Ready")
            assert ready and ready["status"] == "True"
            if pool.gpu:
                assert labels["nvidia.com/gpu.product"] == pool.gpu.product
                assert labels["nvidia.com/gpu.memory"] == str(pool.gpu.memory_mib)
                assert labels["nvidia.com/gpu.count"] == alloc["nvidia.com/gpu"] == str(pool.gpu.count)
                assert [(t.key, t.value, t.effect) for t in n.spec.taints] == [
                    ("nvidia.com/gpu", "present", "NoSchedule")]
            else:
                assert "nvidia.com/gpu" not in alloc and not n.spec.taints


def test_gpu_pod_lands_in_its_pool_until_the_pool_is_full(kube: Kube, namespace: str) -> None:
    # A private two-node copy of the T4 pool (1 GPU per node), so other tests cannot take its GPUs.
    pool = dataclasses.replace(kwok_pools.load_pools()["t4-spot"], name=f"t4-cap-{uuid.uuid4().hex[:5]}")
    nodes = kwok_pools.scale_pool(kube.core, pool, 2)
    try:
        placed = []
        for i in range(2):
            kube.core.create_namespaced_pod(namespace, gpu_pod(f"gpu-{i}", pool.name))
            pod = kube.wait_pod_phase(namespace, f"gpu-{i}", ("Running",))
            placed.append(pod["spec"]["nodeName"])
        assert sorted(placed) == sorted(nodes)
        node = kube.core.read_node(placed[0])
        assert node.metadata.labels["nvidia.com/gpu.product"] == "Tesla-T4"
        assert node.metadata.labels["karpenter.sh/capacity-type"] == "spot"

        kube.core.create_namespaced_pod(namespace, gpu_pod("gpu-2", pool.name))
        cond = kube.wait("gpu-2 Unschedulable", lambda: _unschedulable(kube, namespace, "gpu-2"))
        assert "nvidia.com/gpu" in cond.get("message", ""), cond
        pending = kube.pod(namespace, "gpu-2")
        assert pending and pending["status"]["phase"] == "Pending" and not pending["spec"].get("nodeName")

        # Capacity comes back: one more node and the pending pod is scheduled onto it.
        new = kwok_pools.scale_pool(kube.core, pool, 3)
        pod = kube.wait_pod_phase(namespace, "gpu-2", ("Running",))
        assert pod["spec"]["nodeName"] == (set(new) - set(nodes)).pop()
    finally:
        kwok_pools.delete_pool(kube.core, pool.name)


def _unschedulable(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    cond = condition(kube.pod(ns, name) or {}, "PodScheduled")
    return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None


def test_pod_without_toleration_stays_off_gpu_nodes(kube: Kube, namespace: str) -> None:
    pod = gpu_pod("no-tol", "l4-ondemand")
    pod["spec"]["tolerations"] = []
    kube.core.create_namespaced_pod(namespace, pod)
    cond = kube.wait("no-tol Unschedulable", lambda: _unschedulable(kube, namespace, "no-tol"))
    assert "untolerated taint" in cond.get("message", ""), cond


def test_restricted_namespace_rejects_privileged_pod(kube: Kube, new_namespace: Any) -> None:
    ns = new_namespace({"pod-security.kubernetes.io/enforce": "restricted"})
    privileged = {"metadata": {"name": "priv"}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}
    with pytest.raises(ApiException) as err:
        kube.core.create_namespaced_pod(ns, privileged)
    assert err.value.status == 403
    message = json.loads(err.value.body or "{}")["message"]
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "privileged" in message
    compliant = {"metadata": {"name": "ok"}, "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "busybox", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}
    kube.core.create_namespaced_pod(ns, compliant, dry_run="All")


def test_failing_local_pod_reports_exit_code_and_message(kube: Kube, namespace: str) -> None:
    code = "import sys; open('/dev/termination-log', 'w').write('out of memory: 42 GiB'); sys.exit(3)"
    kube.core.create_namespaced_pod(namespace, local_pod("fails", code))
    pod = kube.wait_pod_phase(namespace, "fails", ("Failed", "Succeeded"), timeout=60)
    assert pod["status"]["phase"] == "Failed"
    state = terminated(pod)
    assert state["exitCode"] == 3
    assert state["reason"] == "Error"
    assert state["message"] == "out of memory: 42 GiB"


def test_local_pod_restarts_on_failure(kube: Kube, namespace: str) -> None:
    code = ("import os, sys; m = '/work/attempted'; first = not os.path.exists(m); open(m, 'w').close();"
            "sys.exit(7 if first else 0)")
    pod = local_pod("retry", code, volumeMounts=[{"name": "work", "mountPath": "/work"}])
    pod["spec"].update(restartPolicy="OnFailure", volumes=[{"name": "work", "emptyDir": {}}])
    kube.core.create_namespaced_pod(namespace, pod)
    done = kube.wait_pod_phase(namespace, "retry", ("Failed", "Succeeded"), timeout=60)
    status = done["status"]["containerStatuses"][0]
    assert done["status"]["phase"] == "Succeeded", status
    assert status["restartCount"] == 1 and status["state"]["terminated"]["exitCode"] == 0


def test_local_pod_env_downward_api_and_configmap(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "cfg"},
                                                       "data": {"greeting.txt": "hi from a ConfigMap"}})
    code = (
        "import json, os; keys = ['POD', 'NS', 'APP', 'NOTE', 'IP', 'CPU', 'FROM_CM', 'COMBINED'];"
        "d = {k: os.environ[k] for k in keys};"
        "d['file'] = open('/etc/memfit/greeting.txt').read();"
        "d['scratch'] = os.path.isdir(os.environ['SCRATCH']) and os.environ['SCRATCH'] != '/' + 'scratch';"
        "open(os.environ['MEMFIT_TERMINATION_MESSAGE_PATH'], 'w').write(json.dumps(d))"
    )
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    env = [
        {"name": "POD", **field("metadata.name")}, {"name": "NS", **field("metadata.namespace")},
        {"name": "APP", **field("metadata.labels['app']")},
        {"name": "NOTE", **field("metadata.annotations['memfit.dev/note']")},
        {"name": "IP", **field("status.podIP")},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting.txt"}}},
        {"name": "COMBINED", "value": "$(POD)/$(NS)"},
        {"name": "SCRATCH", "value": "/scratch"},
    ]
    pod = local_pod("env", code, env=env, resources={"limits": {"cpu": "1500m"}},
                    volumeMounts=[{"name": "cfg", "mountPath": "/etc/memfit"},
                                  {"name": "scratch", "mountPath": "/scratch"}])
    pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "cfg"}},
                              {"name": "scratch", "emptyDir": {}}]
    kube.core.create_namespaced_pod(namespace, pod)
    done = kube.wait_pod_phase(namespace, "env", ("Failed", "Succeeded"), timeout=60)
    state = terminated(done)
    assert done["status"]["phase"] == "Succeeded", state
    assert done["status"]["podIP"] == "127.0.0.1"
    assert json.loads(state["message"]) == {
        "POD": "env", "NS": namespace, "APP": "t", "NOTE": "hello", "IP": "127.0.0.1", "CPU": "2",
        "FROM_CM": "hi from a ConfigMap", "COMBINED": f"env/{namespace}", "file": "hi from a ConfigMap",
        "scratch": True,
    }


def test_deleting_a_local_pod_kills_its_process(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, local_pod("sleeper", "import time; time.sleep(600)"))
    pod = kube.wait_pod_phase(namespace, "sleeper", ("Running",), timeout=60)
    ready = condition(pod, "Ready")
    assert ready and ready["status"] == "True"
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].rsplit("/", 1)[1])
    assert os.path.exists(f"/proc/{pid}")
    kube.core.delete_namespaced_pod("sleeper", namespace)
    kube.wait("sleeper deleted", lambda: kube.pod(namespace, "sleeper") is None, timeout=60)
    kube.wait(f"pid {pid} gone", lambda: not _alive(pid), timeout=10)


def test_simulate_pods_switch_leaves_matching_pods_to_kwok(kube: Kube, namespace: str) -> None:
    # Test-bed switch (docs/testcluster.md, "Simulated pods"): run-local pods the namespace's selector
    # matches go through KWOK's lifecycle and are never executed (this one would exit 3); others still run.
    simulate_pods(kube.core, namespace, "app=t,role=sim")
    sim = local_pod("sim", "raise SystemExit(3)")
    sim["metadata"]["labels"]["role"] = "sim"
    kube.core.create_namespaced_pod(namespace, sim)
    kube.core.create_namespaced_pod(namespace, local_pod("real", "print('ran')"))
    pod = kube.wait_pod_phase(namespace, "sim", ("Running", "Failed", "Succeeded"), timeout=60)
    assert pod["status"]["phase"] == "Running", pod["status"]
    assert "memfit.dev/run-local" not in pod["metadata"]["labels"]
    assert pod["metadata"]["annotations"][SIMULATED_ANNOTATION] == "true"
    assert not pod["status"]["containerStatuses"][0].get("containerID", "").startswith("memfit-local://")
    real = kube.wait_pod_phase(namespace, "real", ("Failed", "Succeeded"), timeout=60)
    assert real["status"]["phase"] == "Succeeded"
    assert real["status"]["containerStatuses"][0]["containerID"].startswith("memfit-local://")
    # Still Running: without simulate-complete-after a simulated pod is kept until deleted.
    assert (kube.pod(namespace, "sim") or {})["status"]["phase"] == "Running"
    assert selector_matches("a=1,b!=2,c,!d", {"a": "1", "b": "3", "c": ""})
    assert not selector_matches("a==1,!d", {"a": "1", "d": "x"})


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def indexed_job(name: str, svc: str, launcher: str) -> dict[str, Any]:
    """A 2-pod Indexed Job whose ranks find each other through `<name>-0.<svc>` and run a gloo all-reduce."""
    script = ["/opt/memfit-test/allreduce_job.py", "/dev/termination-log"]
    master = f"{name}-0.{svc}"
    if launcher == "torchrun":  # Trainer v2 style: PET_* flags, node rank from the downward API
        command = ["python", "-m", "torch.distributed.run", *script]
        index_path = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        index = {"fieldRef": {"fieldPath": index_path}}
        env = [{"name": "PET_NNODES", "value": "2"}, {"name": "PET_NPROC_PER_NODE", "value": "1"},
               {"name": "PET_NODE_RANK", "valueFrom": index},
               {"name": "PET_MASTER_ADDR", "value": master}, {"name": "PET_MASTER_PORT", "value": "29500"}]
    else:  # plain env:// with the rank from JOB_COMPLETION_INDEX
        command = ["python", *script]
        env = [{"name": "MASTER_ADDR", "value": master}, {"name": "MASTER_PORT", "value": "29500"},
               {"name": "WORLD_SIZE", "value": "2"}]
    return {
        "metadata": {"name": name},
        "spec": {
            "completions": 2, "parallelism": 2, "completionMode": "Indexed", "backoffLimit": 0,
            "template": {
                "metadata": {"labels": RUN_LOCAL},
                "spec": {
                    "subdomain": svc, "restartPolicy": "Never", "nodeSelector": CPU_POOL,
                    "containers": [{"name": "trainer", "image": "memfit/trainer:local", "command": command,
                                    "env": env, "volumeMounts": [{"name": "scripts",
                                                                  "mountPath": "/opt/memfit-test"}]}],
                    "volumes": [{"name": "scripts", "configMap": {"name": "scripts"}}],
                },
            },
        },
    }


def test_indexed_jobs_run_gloo_allreduce_through_the_pod_runner(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "scripts"},
        "data": {"allreduce_job.py": (SCRIPTS / "allreduce_job.py").read_text()}})
    # Two jobs at once, both on MASTER_PORT 29500: the runner maps each to its own local port.
    jobs = {"tr": "torchrun", "env": "env"}
    for job, launcher in jobs.items():
        kube.core.create_namespaced_service(namespace, {
            "metadata": {"name": f"{job}-svc"},
            "spec": {"clusterIP": "None", "selector": {"job-name": job}}})
        kube.batch.create_namespaced_job(namespace, indexed_job(job, f"{job}-svc", launcher))
    for job in jobs:
        def done(job: str = job) -> dict[str, Any] | None:
            j = kube.raw(kube.batch.read_namespaced_job_status, job, namespace) or {}
            st = j.get("status") or {}
            if st.get("failed"):
                raise AssertionError(f"job {job} failed: {json.dumps(st)}\n{_job_logs(kube, namespace, job)}")
            return j if st.get("succeeded") == 2 else None

        kube.wait(f"job {job} to succeed", done, timeout=240, interval=1.0)
        pods = kube.pods(namespace, f"job-name={job}")
        assert len(pods) == 2
        messages = sorted(terminated(p)["message"] for p in pods)
        assert all(p["status"]["phase"] == "Succeeded" for p in pods)
        assert messages == [f"rank={r} world=2 sum=3 master=127.0.0.1" for r in (0, 1)], messages


def _job_logs(kube: Kube, ns: str, job: str) -> str:
    pods = kube.pods(ns, f"job-name={job}")
    return json.dumps([p.get("status") for p in pods], default=str)[:4000]

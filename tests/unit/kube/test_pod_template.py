"""spec.podTemplate merged into the profiling and training pods: everything the platform asks is added,
nothing memfit built is changed."""

from __future__ import annotations

import copy
from typing import Any

from factories import OWNER, PLACEMENT, POD, make_plan, make_spec
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.kube.common import container_security_context
from memfit.kube.profile_job import build_profile_job
from memfit.kube.train_job import build_training_job

TEMPLATE: dict[str, Any] = {
    "labels": {"project": "vision", "memfit-example": "yes"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}],
    "envFrom": [{"secretRef": {"name": "wandb"}}],
    "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets"}}],
    "volumeMounts": [{"name": "datasets", "mountPath": "/data", "readOnly": True}],
    "serviceAccountName": "trainer-wandb",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "tolerations": [{"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}],
    "nodeSelector": {"topology.kubernetes.io/zone": "zone-a"},
    "initContainers": [{"name": "wait-for-data", "image": "busybox:1.36", "command": ["true"],
                        "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "lo"}]}],
    "sidecars": [{"name": "log-shipper", "image": "fluent-bit:3"}],
}


def _spec(template: dict[str, Any] | None = TEMPLATE, **sections: Any) -> MemoryOptimizedTrainingJobSpec:
    return make_spec(**({"podTemplate": copy.deepcopy(template)} if template else {}), **sections)


def _train_pod(spec: MemoryOptimizedTrainingJobSpec) -> dict[str, Any]:
    job = build_training_job(owner=OWNER, spec=spec, plan=make_plan(), placement=PLACEMENT, pod=POD)
    return job["spec"]["template"]


def test_the_training_pod_gets_everything_the_template_adds() -> None:
    plain, added = _train_pod(_spec(None)), _train_pod(_spec())
    assert added["metadata"]["labels"] == {**plain["metadata"]["labels"], "project": "vision", "memfit-example": "yes"}
    assert added["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    pod = added["spec"]
    trainer = pod["containers"][0]
    plain_trainer = plain["spec"]["containers"][0]
    assert trainer["env"] == plain_trainer["env"] + TEMPLATE["env"]
    assert trainer["envFrom"] == TEMPLATE["envFrom"]
    assert trainer["volumeMounts"] == plain_trainer["volumeMounts"] + TEMPLATE["volumeMounts"]
    assert trainer["securityContext"] == plain_trainer["securityContext"]
    assert trainer["resources"] == plain_trainer["resources"]
    assert pod["volumes"] == plain["spec"]["volumes"] + TEMPLATE["volumes"]
    assert pod["serviceAccountName"] == "trainer-wandb" and "automountServiceAccountToken" not in pod
    assert pod["imagePullSecrets"] == TEMPLATE["imagePullSecrets"]
    assert pod["tolerations"] == plain["spec"]["tolerations"] + TEMPLATE["tolerations"]
    assert pod["nodeSelector"] == {**PLACEMENT.node_selector, "topology.kubernetes.io/zone": "zone-a"}
    assert pod["securityContext"] == plain["spec"]["securityContext"]


def test_sidecars_are_native_and_start_first_and_every_added_container_is_restricted() -> None:
    spec = _spec(problem={"huggingface": {"model": "org/llama"}})  # a hub model: memfit's fetch-model too
    init = _train_pod(spec)["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["log-shipper", "wait-for-data", "fetch-model"]
    shipper, waiter, fetch = init
    assert shipper["restartPolicy"] == "Always" and "restartPolicy" not in waiter
    assert shipper["securityContext"] == waiter["securityContext"] == container_security_context()
    # The template's variables first, the container's own after (its own value wins).
    assert waiter["env"] == TEMPLATE["env"] + [{"name": "NCCL_SOCKET_IFNAME", "value": "lo"}]
    assert shipper["envFrom"] == TEMPLATE["envFrom"]
    assert fetch["env"][-1] == TEMPLATE["env"][0] and {"name": "datasets", "mountPath": "/data",
                                                      "readOnly": True} in fetch["volumeMounts"]


def test_memfit_keeps_what_it_owns_where_both_set_a_value() -> None:
    pool_key = next(iter(PLACEMENT.node_selector))
    template = {**TEMPLATE, "nodeSelector": {pool_key: "other"}, "labels": {"team": "vision"}}
    pod = _train_pod(_spec(template))
    assert pod["spec"]["nodeSelector"][pool_key] == PLACEMENT.node_selector[pool_key]
    assert pod["metadata"]["labels"]["team"] == POD.extra_labels["team"] == "ml"  # the chart's trainer labels


def test_without_a_template_the_pods_are_unchanged() -> None:
    pod = _train_pod(_spec(None))
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "initContainers" not in pod["spec"] and "imagePullSecrets" not in pod["spec"]


def test_the_profiling_pod_gets_the_template_too() -> None:
    spec = _spec()
    job = build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=PLACEMENT, pod=POD,
                            timeout_seconds=300, template=spec.pod_template)
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["project"] == "vision"
    profiler = pod["spec"]["containers"][0]
    assert profiler["name"] == "profiler" and profiler["env"][-1] == TEMPLATE["env"][0]
    assert profiler["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["log-shipper", "wait-for-data"]
    assert pod["spec"]["serviceAccountName"] == "trainer-wandb"

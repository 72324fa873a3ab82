"""The Indexed training Job, plan ConfigMap and headless Service as the API server will receive them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from factories import OWNER, PLACEMENT, POD, make_plan, make_spec
from memfit.api.common import Offload
from memfit.api.plan import MemoryBreakdown, Plan
from memfit.kube.train_job import (
    build_plan_config_map,
    build_service,
    build_training_job,
)
from pydantic import ValidationError


def _env(job: dict) -> dict[str, object]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_indexed_job_runs_one_pod_per_node_with_torchrun_env() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=POD)
    assert job["metadata"]["name"] == "llama-train-1"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    env = _env(job)
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "4"
    assert env["PET_MASTER_ADDR"] == "llama-train-1-0.llama"
    assert env["PET_NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "llama"
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "g6.12xlarge"}
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert pod["containers"][0]["command"] == ["memfit-trainer", "train"]
    assert spec["template"]["metadata"]["labels"]["team"] == "ml"


def test_pods_meet_restricted_pod_security() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=POD)
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod and "hostPID" not in pod
    assert all("hostPath" not in v for v in pod["volumes"])
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"


def test_owner_reference_is_controller_with_block_owner_deletion() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=POD)
    ref = job["metadata"]["ownerReferences"][0]
    assert ref == {
        "apiVersion": "memfit.dev/v1alpha1",
        "kind": "MemoryOptimizedTrainingJob",
        "name": "llama",
        "uid": "1234-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert job["metadata"]["namespace"] == "ml"


def test_one_node_oom_and_invalid_plan_fail_the_job_and_preemption_is_ignored() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(nodes=1), placement=PLACEMENT, pod=POD)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert rules[1]["action"] == "FailJob" and rules[1]["onExitCodes"]["values"] == [87, 88, 89]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_a_failed_or_disrupted_rank_of_several_nodes_fails_the_job_at_once() -> None:
    # A replaced rank could not rejoin the others' process group: the Job fails, its pods end together,
    # and memfit restarts every rank from the checkpoint (lifecycle.monitor, recovery.maxRestarts).
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(nodes=2), placement=PLACEMENT, pod=POD)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[:2] == [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "NotIn", "values": [0]}},
    ]
    assert all(r["action"] != "Ignore" for r in rules)


def test_kueue_queue_suspends_and_labels_the_job() -> None:
    spec = make_spec(scheduling={"kueueQueue": "team-a"})
    job = build_training_job(
        owner=OWNER, spec=spec, plan=make_plan(), placement=PLACEMENT, pod=POD, suspend=True
    )
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_pod_group_is_no_longer_part_of_the_api() -> None:
    """Gang admission is Kueue's (a multi-node plan is one Workload, docs/kueue.md); the PodGroup path,
    never run against a scheduler plugin, was removed, and the field is refused by name."""
    with pytest.raises(ValidationError) as error:
        make_spec(scheduling={"podGroup": True})
    assert "podGroup" in str(error.value)


def test_checkpoint_claim_and_nvme_offload_mounts() -> None:
    spec = make_spec(training={"checkpoint": {"volumeClaim": "ckpt", "everySteps": 10}})
    memory = MemoryBreakdown(
        parameters_bytes=1,
        gradients_bytes=1,
        optimizer_bytes=1,
        activations_bytes=1,
        temporaries_bytes=1,
        overhead_bytes=1,
        peak_bytes=6,
        host_bytes=2**30,
        nvme_bytes=2**34,
    )
    plan = make_plan(zero_stage=3, offload=Offload.NVME, memory=memory)
    job = build_training_job(owner=OWNER, spec=spec, plan=plan, placement=PLACEMENT, pod=POD)
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert volumes["nvme"]["emptyDir"]["sizeLimit"] == str(4 * 2**34)
    requests = pod["containers"][0]["resources"]["requests"]["memory"]
    assert int(requests) >= 4 * 2**30  # host RAM for offload is requested


def test_fault_injection_env_is_passed_through() -> None:
    job = build_training_job(
        owner=OWNER,
        spec=make_spec(),
        plan=make_plan(),
        placement=PLACEMENT,
        pod=POD,
        extra_env={"MEMFIT_INJECT_OOM_AT_STEP": "3"},
    )
    assert _env(job)["MEMFIT_INJECT_OOM_AT_STEP"] == "3"


def test_plan_config_map_round_trips_the_plan() -> None:
    plan = make_plan()
    cm = build_plan_config_map(owner=OWNER, plan=plan)
    assert cm["metadata"]["name"] == "llama-plan-1"
    assert Plan.model_validate(json.loads(cm["data"]["plan.json"])) == plan


def test_headless_service_selects_trainer_pods() -> None:
    svc = build_service(owner=OWNER)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"memfit.dev/job": "llama", "memfit.dev/component": "trainer"}


def test_one_metrics_port_per_local_rank() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=POD)
    ports = {p["name"]: p["containerPort"] for p in job["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {
        "metrics": 9400,
        "metrics-r1": 9401,
        "metrics-r2": 9402,
        "metrics-r3": 9403,
        "rendezvous": 29500,
    }


def test_output_claim_is_mounted_and_named_to_the_trainer() -> None:
    spec = make_spec(output={"volumeClaim": "models", "path": "out/gpt-lora", "merged": True})
    job = build_training_job(owner=OWNER, spec=spec, plan=make_plan(), placement=PLACEMENT, pod=POD)
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["output"]["persistentVolumeClaim"] == {"claimName": "models"}
    assert mounts["output"] == "/output"
    env = _env(job)
    assert env["MEMFIT_OUTPUT_DIR"] == "/output/out/gpt-lora" and env["MEMFIT_SAVE_MERGED"] == "1"
    plain = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=POD)
    assert "MEMFIT_OUTPUT_DIR" not in _env(plain)


FINETUNE = {
    "problem": {"huggingface": {"volumeClaim": "models", "path": "llama-1b", "sequenceLength": 512}},
    "data": {"files": {"volumeClaim": "corpus", "path": "chat/train.jsonl"}, "messagesField": "messages"},
    "output": {"volumeClaim": "models", "path": "out/llama-1b-ft"},
}


def test_finetune_mounts_model_and_data_claims_read_only_and_stays_offline() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(**FINETUNE), plan=make_plan(), placement=PLACEMENT, pod=POD)
    pod = job["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    for claim in ("models", "corpus"):
        mount = mounts[f"/memfit/volumes/{claim}"]
        assert mount["readOnly"] is True
        assert claims[mount["name"]] == {"claimName": claim, "readOnly": True}
    assert claims[mounts["/output"]["name"]] == {"claimName": "models"}  # the output is written, not read-only
    env = _env(job)
    assert env["MEMFIT_VOLUMES_DIR"] == "/memfit/volumes"
    assert env["MEMFIT_OUTPUT_DIR"] == "/output/out/llama-1b-ft"
    assert env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in env


def test_hub_model_is_downloaded_once_by_the_fetch_init_container_and_trained_offline() -> None:
    """The download step: `memfit-trainer fetch` fills HF_HOME on the checkpoint volume with the token by
    reference and the mirror endpoint; the trainer reads the same cache with the hub off. A refused model
    (exit 88 of the init container) fails the Job at once; an unreachable hub is retried."""
    spec = make_spec(problem={"huggingface": {"model": "meta-llama/Llama-3.2-1B", "revision": "main",
                                              "tokenSecretRef": {"name": "hf-token"}}})
    mirror = replace(POD, hub_endpoint="https://hub-mirror.internal")
    job = build_training_job(owner=OWNER, spec=spec, plan=make_plan(), placement=PLACEMENT, pod=mirror)
    pod = job["spec"]["template"]["spec"]
    [fetch] = pod["initContainers"]
    assert fetch["name"] == "fetch-model" and fetch["image"] == POD.image
    assert fetch["command"] == ["memfit-trainer", "fetch"] and fetch["args"] == ["--plan", "/etc/memfit/plan.json"]
    fetch_env = {e["name"]: e.get("value", e.get("valueFrom")) for e in fetch["env"]}
    token = {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert fetch_env == {"HF_HOME": "/checkpoints/.hub", "HF_TOKEN": token, "HF_ENDPOINT": "https://hub-mirror.internal",
                         "MEMFIT_FETCH_SHARED": "1", "MEMFIT_NODE_RANK": index}  # fmt: skip
    assert "resources" not in fetch  # a ClusterQueue covering only GPUs still admits the pod
    assert {m["name"]: m["mountPath"] for m in fetch["volumeMounts"]}["checkpoints"] == "/checkpoints"
    env = _env(job)
    assert env["HF_HOME"] == "/checkpoints/.hub" and env["HF_HUB_OFFLINE"] == "1"
    # The trainer never reaches the hub: it holds neither the token nor the endpoint.
    assert "HF_TOKEN" not in env and "HF_ENDPOINT" not in env and "MEMFIT_VOLUMES_DIR" not in env
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "fetch-model", "operator": "In",
                                                 "values": [88]}} in rules  # fmt: skip
    # A random-init hub model without an inline config still needs its config.json: the download step runs.
    random = make_spec(problem={"huggingface": {"model": "x/y", "initialize": "random", "sequenceLength": 64}})
    assert build_training_job(owner=OWNER, spec=random, plan=make_plan(), placement=PLACEMENT,
                              pod=POD)["spec"]["template"]["spec"]["initContainers"]  # fmt: skip
    # Nothing to download: a volume model, random weights from an inline config.
    for problem in (FINETUNE["problem"], {"huggingface": {"model": "x/y", "config": {"model_type": "llama"}}}):
        plain = build_training_job(owner=OWNER, spec=make_spec(problem=problem), plan=make_plan(),
                                   placement=PLACEMENT, pod=mirror)  # fmt: skip
        assert "initContainers" not in plain["spec"]["template"]["spec"]
        assert "HF_ENDPOINT" not in _env(plain) and _env(plain)["HF_HUB_OFFLINE"] == "1"


def test_a_hub_dataset_is_downloaded_by_the_fetch_init_container_too() -> None:
    spec = make_spec(problem=FINETUNE["problem"], data={"huggingface": {"name": "org/corpus"}})
    job = build_training_job(owner=OWNER, spec=spec, plan=make_plan(), placement=PLACEMENT, pod=POD)
    [fetch] = job["spec"]["template"]["spec"]["initContainers"]
    assert fetch["name"] == "fetch-model" and {e["name"] for e in fetch["env"]} >= {"HF_HOME"}
    assert "HF_TOKEN" not in {e["name"] for e in fetch["env"]}  # no tokenSecretRef
    env = _env(job)
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == "/checkpoints/.hub"


def test_fs_group_comes_from_the_settings() -> None:
    """The chart's trainer.fsGroup: volumes are made group-readable by it (docs/operator.md)."""
    default = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=POD)
    context = default["spec"]["template"]["spec"]["securityContext"]
    assert (context["fsGroup"], context["fsGroupChangePolicy"]) == (1000, "OnRootMismatch")
    pod = replace(POD, fs_group=2000, fs_group_change_policy="Always")
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(), placement=PLACEMENT, pod=pod)
    context = job["spec"]["template"]["spec"]["securityContext"]
    assert (context["fsGroup"], context["fsGroupChangePolicy"], context["runAsUser"]) == (2000, "Always", 1000)

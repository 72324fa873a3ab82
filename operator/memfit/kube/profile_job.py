"""The profiling Job: one GPU, a deadline, the problem mounted, the Profile in the termination message."""

from __future__ import annotations

import json
from collections.abc import Sequence

from memfit.api import pod as contract
from memfit.api.pod_template import PodTemplate
from memfit.api.problem import HuggingFaceProblem, Problem
from memfit.kube.common import (
    Manifest,
    Owner,
    Placement,
    PodSettings,
    container_security_context,
    metadata,
    pod_security_context,
    tolerations,
)
from memfit.kube.dra import build_claim_template, claim_template_name, use_claim
from memfit.kube.hub import profile_model_access
from memfit.kube.kueue import LABEL_QUEUE
from memfit.kube.names import (
    COMPONENT_PROFILER,
    LABEL_POOL,
    LABEL_PROBLEM,
    job_labels,
    profile_input_name,
    profile_job_name,
)
from memfit.kube.pod_template import apply_pod_template
from memfit.kube.probe_pod import PROBE_PLAN_FILE, ProbeRun, with_probe

PROFILE_BACKOFF_LIMIT = 1  # one retry for a flaky node; a deterministic failure fails fast


def build_profile_input(*, owner: Owner, problem: Problem, problem_hash: str, probe: ProbeRun | None = None) -> Manifest:
    """ConfigMap with the problem JSON the profiler reads (and the probed configuration as a Plan, for a script
    that takes memfit's DeepSpeed config: memfit.kube.probe_pod)."""
    labels = job_labels(owner.name, COMPONENT_PROFILER) | {LABEL_PROBLEM: problem_hash[:16]}
    data = {contract.PROBLEM_FILE: json.dumps(problem.to_wire(), sort_keys=True)}
    if probe is not None and probe.plan_json:
        data[PROBE_PLAN_FILE] = probe.plan_json
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name=profile_input_name(owner.name), owner=owner, labels=labels),
        "data": data,
    }


def build_profile_job(
    *,
    owner: Owner,
    problem_hash: str,
    placement: Placement,
    pod: PodSettings,
    timeout_seconds: int,
    optimizer: str = "adamw",
    optimizer8bit: str = "auto",
    depth: str = "full",
    lora_targets: Sequence[str] = (),
    lora_rank: int = 16,
    lora_dropout: float = 0.0,
    peft_methods: Sequence[str] = (),
    qlora_quant: str = "nf4",
    qlora_double_quant: bool = True,
    queue: str = "",
    model: HuggingFaceProblem | None = None,
    template: PodTemplate | None = None,
    probe: ProbeRun | None = None,
) -> Manifest:
    """Job `<job>-profile`: runs `memfit-trainer profile` on one GPU of the profiling pool.

    `optimizer` is the job's `training.optimizer` and `optimizer8bit` its `strategy.optimizer8bit`
    (a Toggle: auto/enabled/disabled): the profile measures the optimizer the job will train
    with, and `problem_hash` should then be `memfit.api.hashing.profile_cache_key` of them. `depth`
    `reduced` measures 1 and 2 of the model's repeated blocks (memfit.lifecycle.profile_fit).
    `lora_targets` / `lora_rank`: when the job allows LoRA/QLoRA, the profiler checks them against the
    model's modules (a mismatch fails the profile with `strategy.peft.lora.targetModules`) and, with
    `peft_methods`, also measures those adapters on a frozen base (the PEFT variant). `queue`: the Kueue
    LocalQueue (`scheduling.kueueQueue`): the Job carries its label and is created suspended, as the
    training Job is; Kueue admits it against the profiling pool's flavor. `model`: the job's Hugging Face
    model; without an inline config the profiler reads its config.json from the model's claim (mounted
    read-only) or from the hub (memfit.kube.hub.profile_model_access). `template`: the job's
    spec.podTemplate, added to the pod (memfit.kube.pod_template). `probe`: a job's own container
    measured after the profiler (memfit.kube.probe_pod): the profiler becomes an init container and the
    user's container, under the probe, the pod's one container; both use the one GPU.
    """
    model_mounts, model_volumes, model_env = profile_model_access(model, pod)
    peft_args: list[str] = []
    if lora_targets:
        peft_args = ["--lora-targets", ",".join(lora_targets), "--lora-rank", str(lora_rank)]
    if lora_targets and peft_methods:
        peft_args += ["--lora-dropout", str(lora_dropout), "--peft-methods", ",".join(peft_methods),
                      "--qlora-quant", qlora_quant, "--qlora-double-quant", "on" if qlora_double_quant else "off"]
    labels = job_labels(owner.name, COMPONENT_PROFILER) | {
        LABEL_PROBLEM: problem_hash[:16],
        LABEL_POOL: placement.pool,
    }
    container: Manifest = {
        "name": contract.PROFILER_CONTAINER,
        "image": pod.image,
        "imagePullPolicy": pod.image_pull_policy,
        "command": ["memfit-trainer", "profile"],
        "args": ["--problem", f"{contract.PLAN_MOUNT}/{contract.PROBLEM_FILE}", "--out", "/tmp/profile.json",
                 "--optimizer", optimizer, "--optimizer8bit", _toggle(optimizer8bit),
                 *(["--depth", "reduced"] if depth == "reduced" else []), *peft_args],
        "env": [{"name": contract.ENV_JOB, "value": owner.name}, *model_env],
        "resources": {} if placement.dra else {"limits": {placement.gpu_resource: "1"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "problem", "mountPath": contract.PLAN_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            *model_mounts,
        ],
    }
    pod_spec: Manifest = {
        "restartPolicy": "Never",
        "securityContext": pod_security_context(pod),
        "nodeSelector": dict(placement.node_selector),
        "tolerations": tolerations(placement),
        "containers": [container],
        "volumes": [
            {"name": "problem", "configMap": {"name": profile_input_name(owner.name)}},
            {"name": "tmp", "emptyDir": {}},
            *model_volumes,
        ],
        "automountServiceAccountToken": False,
    }
    if pod.service_account:
        pod_spec["serviceAccountName"] = pod.service_account
    gpu_containers = [container]
    if probe is not None:
        gpu_containers.append(with_probe(pod_spec, pod, probe))
    if placement.dra is not None:  # one device of the pool's class by claim (profile_claim_template)
        for gpu_container in gpu_containers:
            use_claim(pod_spec, gpu_container, claim_template_name(profile_job_name(owner.name)))
    job_labels_ = labels | ({LABEL_QUEUE: queue} if queue else {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name=profile_job_name(owner.name), owner=owner, labels=job_labels_),
        "spec": {
            "suspend": bool(queue),
            "backoffLimit": PROFILE_BACKOFF_LIMIT,
            "activeDeadlineSeconds": timeout_seconds,
            "template": apply_pod_template({"metadata": {"labels": labels | pod.extra_labels}, "spec": pod_spec},
                                           template),
        },
    }


def _toggle(value: str) -> str:
    """A Toggle (`auto`, `enabled`, `disabled`) as the profiler's --optimizer8bit choice (auto, on, off)."""
    return {"enabled": "on", "disabled": "off", "on": "on", "off": "off"}.get(str(value).lower(), "auto")


def profile_claim_template(*, owner: Owner, placement: Placement) -> Manifest | None:
    """The ResourceClaimTemplate of the profiling Job on a DRA pool (None otherwise): one device of the
    pool's class (and MIG profile); the profile measures what the job needs, so no memory floor."""
    if placement.dra is None:
        return None
    labels = job_labels(owner.name, COMPONENT_PROFILER) | {LABEL_POOL: placement.pool}
    return build_claim_template(owner=owner, name=claim_template_name(profile_job_name(owner.name)),
                                request=placement.dra, count=1, min_bytes=None, labels=labels)

"""The training children: plan ConfigMap, headless Service and the Indexed Job running torchrun."""

from __future__ import annotations

from pydantic import ValidationError

from memfit.api import pod as contract
from memfit.api.common import Offload
from memfit.api.job import MemoryOptimizedTrainingJobSpec, PlanSummary
from memfit.api.plan import Plan
from memfit.api.termination import DEFAULT_TERMINATION_MESSAGE_PATH, EXIT_INVALID_PLAN, FAIL_JOB_EXIT_CODES
from memfit.kube.checkpoints import checkpoint_volume
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
from memfit.kube.hub import hub_env
from memfit.kube.kueue import LABEL_QUEUE
from memfit.kube.names import (
    ANNOTATION_PLAN,
    COMPONENT_TRAINER,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_JOB,
    LABEL_POOL,
    job_labels,
    plan_config_map_name,
    service_name,
    train_job_name,
)
from memfit.kube.own_code import apply_own_container
from memfit.kube.pod_template import apply_pod_template

RETRYABLE_POD_FAILURES = 3  # other crashes: the pod restarts and resumes from the last checkpoint
SHM_MIN_BYTES = 1 << 30
FETCH_CONTAINER = contract.FETCH_CONTAINER
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


PLAN_KEY = contract.PLAN_FILE
PLAN_PATH = f"{contract.PLAN_MOUNT}/{contract.PLAN_FILE}"
SUMMARY_KEY = "summary.json"


def plan_json(plan: Plan) -> str:
    """The Plan as stored in its ConfigMap (and annotated on the training Job)."""
    return plan.model_dump_json(by_alias=True, exclude_none=True, indent=1)


def build_plan_config_map(
    *, owner: Owner, plan: Plan, summary: PlanSummary | None = None, deepspeed_config: str | None = None
) -> Manifest:
    """ConfigMap `<job>-plan-<attempt>`: the Plan JSON (and the engine config) mounted at /etc/memfit.

    It is the durable record of the decision: with the status summary beside the Plan, an operator
    that lost the job's status rebuilds the same summary (baseline and savings included)."""
    data = {PLAN_KEY: plan_json(plan)}
    if summary is not None:
        data[SUMMARY_KEY] = summary.model_dump_json(by_alias=True, exclude_none=True)
    if deepspeed_config:
        data["deepspeed.json"] = deepspeed_config
    labels = job_labels(owner.name, COMPONENT_TRAINER) | {LABEL_ATTEMPT: str(plan.attempt)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name=plan_config_map_name(owner.name, plan.attempt), owner=owner, labels=labels),
        "data": data,
    }


def parse_plan_record(data: dict[str, str] | None) -> tuple[Plan | None, PlanSummary | None]:
    """The Plan and its summary from a plan ConfigMap's data; (None, None) when absent or unreadable."""
    try:
        plan = Plan.model_validate_json((data or {})[PLAN_KEY])
    except (KeyError, ValidationError):
        return None, None
    try:
        summary = PlanSummary.model_validate_json((data or {})[SUMMARY_KEY])
    except (KeyError, ValidationError):
        summary = None
    return plan, summary


def build_service(*, owner: Owner) -> Manifest:
    """Headless Service `<job>`: stable DNS `<job>-train-<k>-<index>.<job>` for torchrun rendezvous."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            name=service_name(owner.name), owner=owner, labels=job_labels(owner.name, COMPONENT_TRAINER)
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: owner.name, LABEL_COMPONENT: COMPONENT_TRAINER},
            "ports": [{"name": "rendezvous", "port": contract.MASTER_PORT, "targetPort": contract.MASTER_PORT}],
        },
    }


def _env(*, owner: Owner, plan: Plan) -> list[Manifest]:
    job = train_job_name(owner.name, plan.attempt)
    return [
        {"name": contract.ENV_NNODES, "value": str(plan.nodes)},
        {"name": contract.ENV_NPROC_PER_NODE, "value": str(plan.gpus_per_node)},
        {"name": contract.ENV_TORCHRUN_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": contract.ENV_MASTER_ADDR, "value": f"{job}-0.{service_name(owner.name)}"},
        {"name": contract.ENV_MASTER_PORT, "value": str(contract.MASTER_PORT)},
        {"name": contract.ENV_JOB, "value": owner.name},
        {"name": contract.ENV_METRICS_PORT, "value": str(contract.METRICS_PORT)},
        {"name": contract.ENV_PLAN_PATH, "value": PLAN_PATH},
        # One folder per job on the checkpoint volume; a re-plan's attempt resumes from it.
        {"name": contract.ENV_CHECKPOINT_DIR, "value": f"{contract.CHECKPOINT_MOUNT}/{owner.name}"},
    ]


def _output_env(*, owner: Owner, spec: MemoryOptimizedTrainingJobSpec) -> list[Manifest]:
    """MEMFIT_OUTPUT_DIR (and MEMFIT_SAVE_MERGED) when the job names an output volume."""
    if spec.output is None:
        return []
    folder = spec.output.path.strip("/") or owner.name
    env: list[Manifest] = [{"name": contract.ENV_OUTPUT_DIR, "value": f"{contract.OUTPUT_MOUNT}/{folder}"}]
    if spec.output.merged:
        env.append({"name": contract.ENV_SAVE_MERGED, "value": "1"})
    return env


def named_claims(spec: MemoryOptimizedTrainingJobSpec) -> list[tuple[str, str]]:
    """(field path, claim) of every PersistentVolumeClaim the job names for its model, data and output."""
    named: list[tuple[str, str]] = []
    hf = spec.problem.huggingface
    if hf is not None and hf.volume_claim:
        named.append(("spec.problem.huggingface.volumeClaim", hf.volume_claim))
    if spec.data is not None and spec.data.files is not None:
        named.append(("spec.data.files.volumeClaim", spec.data.files.volume_claim))
    if spec.output is not None:
        named.append(("spec.output.volumeClaim", spec.output.volume_claim))
    return named


def source_claims(spec: MemoryOptimizedTrainingJobSpec) -> list[str]:
    """The PersistentVolumeClaims the trainer reads from (pretrained model, dataset), each once, sorted."""
    claims: set[str] = set()
    hf = spec.problem.huggingface
    if hf is not None and hf.volume_claim:
        claims.add(hf.volume_claim)
    if spec.data is not None and spec.data.files is not None:
        claims.add(spec.data.files.volume_claim)
    return sorted(claims)


def _source_volumes(
    spec: MemoryOptimizedTrainingJobSpec, pod: PodSettings
) -> tuple[list[Manifest], list[Manifest], list[Manifest]]:
    """Read-only mounts of the model and data claims at /memfit/volumes/<claim>, and the trainer's
    environment for them: HF_HOME on the checkpoint volume (where the download step put what comes from
    the hub) and HF_HUB_OFFLINE (the trainer never reaches the hub, so it never holds the hub token)."""
    mounts: list[Manifest] = []
    volumes: list[Manifest] = []
    for index, claim in enumerate(source_claims(spec)):
        name = f"source-{index}"
        mounts.append({"name": name, "mountPath": f"{contract.VOLUMES_MOUNT}/{claim}", "readOnly": True})
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    env: list[Manifest] = [{"name": contract.ENV_VOLUMES_DIR, "value": contract.VOLUMES_MOUNT}] if volumes else []
    if needs_download(spec):
        env.append({"name": contract.ENV_HF_HOME, "value": contract.HUB_CACHE})
    if spec.problem.huggingface is not None:
        env.append({"name": contract.ENV_HF_HUB_OFFLINE, "value": "1"})
    return mounts, volumes, env


def needs_download(spec: MemoryOptimizedTrainingJobSpec) -> bool:
    """Something comes from the hub (weights, config and tokenizer, the dataset): the training pods start
    with the download step."""
    hf = spec.problem.huggingface
    if hf is None:
        return False
    real_data = spec.data is not None and spec.data.real
    return bool(hf.hub_files(tokenizer=real_data)) or (spec.data is not None and spec.data.huggingface is not None)


def _fetch_container(spec: MemoryOptimizedTrainingJobSpec, pod: PodSettings) -> Manifest:
    """The download step: `memfit-trainer fetch` puts the hub model and dataset into HF_HOME on the
    checkpoint volume once (a later attempt or a replaced pod finds them there); the trainer then reads
    them offline."""
    return {
        "name": FETCH_CONTAINER,
        "image": pod.image,
        "imagePullPolicy": pod.image_pull_policy,
        "command": ["memfit-trainer", "fetch"],
        "args": ["--plan", PLAN_PATH],
        "env": [*(hub_env(spec.problem.huggingface, pod, home=contract.HUB_CACHE) if spec.problem.huggingface else []),
                *_fetch_rank_env(spec)],
        # No requests of its own: a ClusterQueue that covers only GPUs must still admit the pod.
        "terminationMessagePath": DEFAULT_TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "plan", "mountPath": contract.PLAN_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "checkpoints", "mountPath": contract.CHECKPOINT_MOUNT},
        ],
    }


def build_training_job(
    *,
    owner: Owner,
    spec: MemoryOptimizedTrainingJobSpec,
    plan: Plan,
    placement: Placement,
    pod: PodSettings,
    suspend: bool = False,
    extra_env: dict[str, str] | None = None,
) -> Manifest:
    """Indexed Job `<job>-train-<attempt>`: one pod per node, torchrun with the node rank from the index."""
    name = train_job_name(owner.name, plan.attempt)
    labels = job_labels(owner.name, COMPONENT_TRAINER) | {
        LABEL_ATTEMPT: str(plan.attempt),
        LABEL_POOL: placement.pool,
    }
    job_meta_labels = dict(labels)
    if spec.scheduling.kueue_queue:
        job_meta_labels[LABEL_QUEUE] = spec.scheduling.kueue_queue
    offloaded_states = plan.memory.host_bytes - plan.memory.host_activation_bytes
    shm_bytes = max(SHM_MIN_BYTES, offloaded_states * plan.gpus_per_node // 4)
    mounts: list[Manifest] = [
        {"name": "plan", "mountPath": contract.PLAN_MOUNT, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "checkpoints", "mountPath": contract.CHECKPOINT_MOUNT},
    ]
    volumes: list[Manifest] = [
        {"name": "plan", "configMap": {"name": plan_config_map_name(owner.name, plan.attempt)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": str(shm_bytes)}},
        {"name": "tmp", "emptyDir": {}},
    ]
    # Durable by default: memfit's `<job>-checkpoints` claim or the user's; an emptyDir only when asked.
    claim = checkpoint_volume(spec, owner.name).claim
    volumes.append(
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}
        if claim
        else {"name": "checkpoints", "emptyDir": {}}
    )
    source_mounts, source_volumes, source_env = _source_volumes(spec, pod)
    mounts += source_mounts
    volumes += source_volumes
    output = spec.output
    if output is not None:
        mounts.append({"name": "output", "mountPath": contract.OUTPUT_MOUNT})
        volumes.append({"name": "output", "persistentVolumeClaim": {"claimName": output.volume_claim}})
    if plan.offload == Offload.NVME:
        mounts.append({"name": "nvme", "mountPath": contract.NVME_MOUNT})
        volumes.append(
            {"name": "nvme", "emptyDir": {"sizeLimit": str(plan.memory.nvme_bytes * plan.gpus_per_node)}}
        )
    resources: Manifest = {} if placement.dra else {"limits": {placement.gpu_resource: str(plan.gpus_per_node)}}
    host_bytes = plan.memory.host_bytes * plan.gpus_per_node
    if host_bytes:
        # Offloaded optimizer state and activations live in host RAM (plus /dev/shm, which counts against
        # the limit).
        resources["requests"] = {"memory": str(host_bytes + shm_bytes)}
    container: Manifest = {
        "name": contract.TRAINER_CONTAINER,
        "image": pod.image,
        "imagePullPolicy": pod.image_pull_policy,
        # `memfit-trainer train` starts torchrun for multi-GPU plans and keeps the trainer's exit codes.
        "command": ["memfit-trainer", "train"],
        "args": ["--plan", PLAN_PATH],
        "env": _env(owner=owner, plan=plan) + _output_env(owner=owner, spec=spec) + source_env
        + [{"name": k, "value": v} for k, v in sorted((extra_env or {}).items())],
        # Each local rank serves its metrics on METRICS_PORT + local rank.
        "ports": [
            {"name": "metrics", "containerPort": contract.METRICS_PORT},
            *(
                {"name": f"metrics-r{rank}", "containerPort": contract.METRICS_PORT + rank}
                for rank in range(1, plan.gpus_per_node)
            ),
            {"name": "rendezvous", "containerPort": contract.MASTER_PORT},
        ],
        "resources": resources,
        "terminationMessagePath": DEFAULT_TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    pod_spec: Manifest = {
        "restartPolicy": "Never",
        "subdomain": service_name(owner.name),
        "securityContext": pod_security_context(pod),
        "nodeSelector": dict(placement.node_selector),
        "tolerations": tolerations(placement),
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
    }
    if needs_download(spec):
        pod_spec["initContainers"] = [_fetch_container(spec, pod)]
    apply_own_container(pod_spec, spec.container, plan, pod, plan_path=PLAN_PATH)
    if placement.dra is not None:  # the plan's GPUs by claim (memfit.kube.dra.training_claim_template)
        use_claim(pod_spec, pod_spec["containers"][0], claim_template_name(name))
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    if pod.service_account:
        pod_spec["serviceAccountName"] = pod.service_account
    pod_labels = labels | pod.extra_labels
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(
            name=name, owner=owner, labels=job_meta_labels, annotations={ANNOTATION_PLAN: plan.describe()}
        ),
        "spec": {
            "completionMode": "Indexed",
            "completions": plan.nodes,
            "parallelism": plan.nodes,
            "backoffLimit": RETRYABLE_POD_FAILURES,
            "suspend": suspend,
            "podFailurePolicy": {"rules": [*_trainer_failure_rules(plan.nodes), *_fetch_failure_rule(spec)]},
            "template": apply_pod_template({"metadata": {"labels": pod_labels}, "spec": pod_spec},
                                           spec.pod_template),
        },
    }


def _trainer_failure_rules(nodes: int) -> list[Manifest]:
    """How the Job treats a failed trainer pod. One node: pre-emption and drain are ignored (the
    replacement pod resumes from the last checkpoint), OOM and an invalid plan are decisions for memfit
    (re-plan, give up), other crashes are retried by the Job's backoff. Several nodes: a replaced rank
    cannot rejoin the others' process group (they would wait in a collective until it times out), so
    any failure of any rank fails the Job at once, its other pods are ended together, and memfit starts
    the next attempt with every rank resuming from the checkpoint (recovery.maxRestarts)."""
    if nodes > 1:
        return [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": contract.TRAINER_CONTAINER,
                                                  "operator": "NotIn", "values": [0]}},
        ]
    return [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": contract.TRAINER_CONTAINER, "operator": "In",
                                              "values": list(FAIL_JOB_EXIT_CODES)}},
    ]


def _fetch_rank_env(spec: MemoryOptimizedTrainingJobSpec) -> list[Manifest]:
    """On a checkpoint claim every node of a multi-node plan shares: node 0 downloads, the others wait
    for its marker (concurrent writers into one hub cache on network storage do not lock reliably)."""
    if checkpoint_volume(spec, "x").claim is None:
        return []
    return [{"name": contract.ENV_FETCH_SHARED, "value": "1"},
            {"name": contract.ENV_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}]


def _fetch_failure_rule(spec: MemoryOptimizedTrainingJobSpec) -> list[Manifest]:
    """A model the hub refuses (no such repository or revision, a token that may not read it) is not
    retried: the fields are wrong. An unreachable hub is (the Job's backoff)."""
    if not needs_download(spec):
        return []
    rule = {"containerName": FETCH_CONTAINER, "operator": "In", "values": [EXIT_INVALID_PLAN]}
    return [{"action": "FailJob", "onExitCodes": rule}]




def training_claim_template(*, owner: Owner, plan: Plan, placement: Placement) -> Manifest | None:
    """The ResourceClaimTemplate of a training attempt on a DRA pool (None on a device-plugin pool): the
    plan's GPUs per pod, each with the predicted peak plus the plan's headroom of memory."""
    if placement.dra is None:
        return None
    need = int(plan.memory.peak_bytes * (1 + plan.headroom_percent / 100))
    name = train_job_name(owner.name, plan.attempt)
    labels = job_labels(owner.name, COMPONENT_TRAINER) | {LABEL_ATTEMPT: str(plan.attempt), LABEL_POOL: placement.pool}
    return build_claim_template(owner=owner, name=claim_template_name(name), request=placement.dra,
                                count=plan.gpus_per_node, min_bytes=need, labels=labels)

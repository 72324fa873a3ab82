"""`spec.podTemplate`: what a platform adds to every pod of a job (profiling and training), in the spirit of
Kubeflow Trainer's runtime patches: labels, annotations, env and envFrom for all containers, extra volumes
and their mounts, a service account, image pull secrets, extra tolerations and node-selector terms, init
containers and sidecars.

memfit keeps what it owns (`memfit.api.pod`: its containers, volumes, mount paths and environment, the GPU
resources, the pool's selector and taints, the restricted security context); a template that would change
one of them is refused naming the field (`memfit.api.pod_template_rules`, mirrored by the CRD's CEL rules).
The merge into a pod is `memfit.kube.pod_template.apply_pod_template`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, WithJsonSchema

from memfit.api.common import IMAGE_MAX, LIST_MAX, NAME_MAX, ApiModel, DNSLabel, Toleration

# Kubernetes' own bounds: a label value 63, a qualified key 253 (prefix) + 63 (name), env names free-form.
KEY_MAX = 317
VALUE_MAX = 4096
PATH_MAX = 1024
ARGS_MAX = 64

_PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}
_Source = Annotated[dict[str, Any] | None, WithJsonSchema({"type": "object", **_PRESERVE})]
Quantity = Annotated[str | int, WithJsonSchema({"x-kubernetes-int-or-string": True})]
EnvName = Annotated[str, Field(min_length=1, max_length=NAME_MAX * 4, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]


class EnvVar(ApiModel):
    """core/v1 EnvVar: a value, or valueFrom (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."""

    name: EnvName = Field(description="Variable name.")
    value: str | None = Field(default=None, max_length=VALUE_MAX, description="Value; $(VAR) expands.")
    value_from: _Source = Field(default=None, description="core/v1 EnvVarSource.")


class LocalObjectReference(ApiModel):
    name: DNSLabel = Field(description="Object name in the job's namespace.")


class EnvFromSource(ApiModel):
    """core/v1 EnvFromSource: every key of a ConfigMap or Secret as a variable. memfit's own variables are
    set explicitly and so take precedence over a key of the same name."""

    prefix: str | None = Field(default=None, max_length=NAME_MAX, description="Prepended to each key.")
    config_map_ref: _Source = Field(default=None, description="core/v1 ConfigMapEnvSource.")
    secret_ref: _Source = Field(default=None, description="core/v1 SecretEnvSource.")


class Volume(ApiModel):
    """A pod volume of a source the restricted Pod Security level allows (no hostPath)."""

    name: DNSLabel = Field(description="Volume name (memfit's own names are refused).")
    persistent_volume_claim: _Source = Field(default=None, description="core/v1 PersistentVolumeClaimVolumeSource.")
    config_map: _Source = Field(default=None, description="core/v1 ConfigMapVolumeSource.")
    secret: _Source = Field(default=None, description="core/v1 SecretVolumeSource.")
    empty_dir: _Source = Field(default=None, description="core/v1 EmptyDirVolumeSource.")
    projected: _Source = Field(default=None, description="core/v1 ProjectedVolumeSource.")
    downward_api: _Source = Field(default=None, alias="downwardAPI", description="core/v1 DownwardAPIVolumeSource.")
    csi: _Source = Field(default=None, description="core/v1 CSIVolumeSource.")
    ephemeral: _Source = Field(default=None, description="core/v1 EphemeralVolumeSource.")


VOLUME_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "projected", "downwardAPI",
                  "csi", "ephemeral")


class VolumeMount(ApiModel):
    """core/v1 VolumeMount of a template volume."""

    name: DNSLabel = Field(description="A volume of spec.podTemplate.volumes.")
    mount_path: str = Field(min_length=1, max_length=PATH_MAX, description="Absolute path in the container.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(default=None, max_length=PATH_MAX, description="Sub-path of the volume.")


class ContainerPort(ApiModel):
    name: str | None = Field(default=None, max_length=15, description="Port name.")
    container_port: int = Field(ge=1, le=65535, description="Port number.")
    protocol: str | None = Field(default=None, pattern=r"^(TCP|UDP|SCTP)$", max_length=4, description="TCP, UDP or SCTP.")


class Resources(ApiModel):
    """core/v1 ResourceRequirements of a sidecar or init container (GPUs are memfit's to request)."""

    limits: dict[str, Quantity] | None = Field(default=None, max_length=16, description="Limits.")
    requests: dict[str, Quantity] | None = Field(default=None, max_length=16, description="Requests.")


class Container(ApiModel):
    """An init container or sidecar the platform adds. memfit gives it the restricted security context
    (non-root uid 1000, no privilege escalation, all capabilities dropped, a read-only root file system)
    and the template's env, envFrom; a `securityContext` of its own is refused."""

    name: DNSLabel = Field(description="Container name (trainer, profiler and fetch-model are memfit's).")
    image: str = Field(min_length=1, max_length=IMAGE_MAX, description="Image.")
    image_pull_policy: str | None = Field(
        default=None, pattern=r"^(Always|IfNotPresent|Never)$", max_length=16, description="Pull policy.")
    command: list[Annotated[str, Field(max_length=VALUE_MAX)]] | None = Field(
        default=None, max_length=ARGS_MAX, description="Entrypoint.")
    args: list[Annotated[str, Field(max_length=VALUE_MAX)]] | None = Field(
        default=None, max_length=ARGS_MAX, description="Arguments; $(VAR) expands.")
    working_dir: str | None = Field(default=None, max_length=PATH_MAX, description="Working directory.")
    env: list[EnvVar] | None = Field(default=None, max_length=LIST_MAX, description="Its own variables.")
    env_from: list[EnvFromSource] | None = Field(default=None, max_length=LIST_MAX, description="ConfigMaps, Secrets.")
    ports: list[ContainerPort] | None = Field(default=None, max_length=LIST_MAX, description="Ports it serves.")
    resources: Resources | None = Field(default=None, description="CPU and memory requests and limits.")
    volume_mounts: list[VolumeMount] | None = Field(
        default=None, max_length=LIST_MAX, description="Mounts of spec.podTemplate.volumes.")
    # Declared so that they are refused with a reason (memfit.api.pod_template_rules), not as unknown fields.
    security_context: _Source = Field(default=None, description="Refused: memfit sets the restricted one.")
    restart_policy: str | None = Field(default=None, max_length=16, description="Refused: use sidecars.")


Labels = Annotated[dict[str, Annotated[str, Field(max_length=VALUE_MAX)]], Field(max_length=LIST_MAX)]


class PodTemplate(ApiModel):
    """What memfit adds to every pod of the job (the profiling pod and each training pod)."""

    labels: Labels = Field(default_factory=dict, description="Pod labels (memfit's, Kueue's and the Job "
                           "controller's keys are refused).")
    annotations: Labels = Field(default_factory=dict, description="Pod annotations (same keys refused).")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=LIST_MAX,
        description="Variables for every container (memfit's own names, e.g. MEMFIT_PLAN_PATH, PET_*, HF_HOME, "
        "are refused).")
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=LIST_MAX, description="ConfigMaps and Secrets for every container.")
    volumes: list[Volume] = Field(default_factory=list, max_length=LIST_MAX, description="Extra volumes.")
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=LIST_MAX,
        description="Mounts of the template's volumes into memfit's containers (not at or inside memfit's "
        "paths: /etc/memfit, /checkpoints, /output, /nvme, /memfit, /dev/shm, /tmp).")
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The pods' ServiceAccount (instead of the namespace's default); its token is mounted as "
        "the ServiceAccount says (memfit's pods otherwise mount none).")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=LIST_MAX, description="Secrets to pull the images with.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=LIST_MAX, description="Added to the pool's tolerations.")
    node_selector: Annotated[dict[str, Annotated[str, Field(max_length=NAME_MAX)]], Field(max_length=LIST_MAX)] = Field(
        default_factory=dict,
        description="Added to the pool's node selector; a pool whose selector sets one of these keys to "
        "another value is not planned on.")
    init_containers: list[Container] = Field(
        default_factory=list, max_length=LIST_MAX,
        description="Run to completion, in order, before memfit's containers (after the sidecars start).")
    sidecars: list[Container] = Field(
        default_factory=list, max_length=LIST_MAX,
        description="Run beside memfit's containers for the pod's life (Kubernetes native sidecars: init "
        "containers with restartPolicy Always, so the Job still completes).")

    def selector_conflicts(self, pool_selector: dict[str, str]) -> list[str]:
        """`key=value` of the template's node-selector terms that a pool's selector sets to another value:
        no node of that pool matches both, so the planner leaves the pool out."""
        return [f"{key}={value}" for key, value in sorted(self.node_selector.items())
                if key in pool_selector and pool_selector[key] != value]


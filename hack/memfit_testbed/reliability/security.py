"""Security properties (issue 8 §6): what any pod memfit builds may and may not contain, and where
secrets must never appear.

`pod_violations` checks one Job or Pod manifest; `valid_specs` generates specs a user may submit (all
accepted by the API); `builder_violations` plans and builds them; `restricted_run` runs jobs in a
`restricted` Pod Security namespace with canary secrets planted; `find_secrets` scans for them.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import uuid
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from kubernetes import client
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.api.profile import Profile
from memfit.catalog import CATALOG
from memfit.kube.common import Owner, Placement, PodSettings
from memfit.kube.profile_job import build_profile_job
from memfit.kube.train_job import build_training_job
from memfit.lifecycle.planning import plan_job
from memfit.memory.problems import shape_from_problem

from memfit_testbed.paths import REPO
from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability.chaos import (
    GROUP,
    MOTJ,
    VERSION,
    ChaosCluster,
    operator_for,
    quickstart,
)
from memfit_testbed.reliability.hostile_specs import QUICKSTART

ALLOWED_VOLUMES = {"configMap", "emptyDir", "persistentVolumeClaim"}
HOST_FIELDS = ("hostNetwork", "hostPID", "hostIPC", "hostUsers")


def pod_spec_of(manifest: dict[str, Any]) -> dict[str, Any]:
    if manifest.get("kind") == "Job" or "template" in (manifest.get("spec") or {}):
        return dict(manifest["spec"]["template"]["spec"])
    return dict(manifest["spec"])


def pod_violations(manifest: dict[str, Any], *, namespace: str) -> list[str]:
    """Everything in a memfit Job or Pod that `restricted` Pod Security or memfit's promises forbid."""
    out: list[str] = []
    meta = manifest.get("metadata") or {}
    where = f"{manifest.get('kind', 'Pod')} {meta.get('name')}"
    if meta.get("namespace") != namespace:
        out.append(f"{where}: namespace {meta.get('namespace')!r}, not the job's {namespace!r}")
    spec = pod_spec_of(manifest)
    for key in HOST_FIELDS:
        if key == "hostUsers":
            if spec.get(key) is True:
                out.append(f"{where}: hostUsers true")
        elif spec.get(key):
            out.append(f"{where}: {key}")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"{where}: volume {volume.get('name')} of type {sorted(kinds)}")
    pod_ctx = spec.get("securityContext") or {}
    if pod_ctx.get("runAsNonRoot") is not True:
        out.append(f"{where}: pod runAsNonRoot is not true")
    if pod_ctx.get("runAsUser") == 0:
        out.append(f"{where}: runAsUser 0")
    if (pod_ctx.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        out.append(f"{where}: seccompProfile not RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not False:
        out.append(f"{where}: service account token mounted")
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        ctx = container.get("securityContext") or {}
        name = f"{where} container {container.get('name')}"
        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        caps = ctx.get("capabilities") or {}
        if caps.get("add"):
            out.append(f"{name}: adds capabilities {caps['add']}")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: does not drop ALL capabilities")
        if ctx.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{name}: hostPort {port['hostPort']}")
    return out


subdomains = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]{1,8})?\Z")
STRATEGIES = [
    {},
    {"engine": "ddp", "zeroStage": 0, "offload": "none"},
    {"engine": "fsdp", "zeroStage": 3},
    {"engine": "deepspeed", "zeroStage": 3, "offload": "nvme"},
    {"engine": "deepspeed", "zeroStage": 2, "offload": "cpu", "optimizer8bit": "disabled"},
    {"precision": "fp32", "activationCheckpointing": "full"},
]


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A MOTJ spec the API server accepts, varying everything that reaches a pod."""
    spec = copy.deepcopy(QUICKSTART["spec"])
    spec["placement"] = {"maxNodes": draw(st.integers(1, 4))}
    spec["strategy"] = dict(draw(st.sampled_from(STRATEGIES)))
    spec["image"] = draw(
        st.sampled_from(["", "trainer:1", "registry.local:5000/ml/trainer@sha256:" + "a" * 64])
    )
    spec["scheduling"] = {
        "kueueQueue": draw(st.one_of(st.just(""), subdomains)),  # a LocalQueue name
        "priorityClassName": draw(st.one_of(st.just(""), subdomains)),
    }
    claim = draw(st.one_of(st.none(), subdomains))
    spec["training"] = {**spec["training"], "checkpoint": {"volumeClaim": claim} if claim else {}}
    return spec


def find_secrets(text: str, secrets: list[str]) -> list[str]:
    """The secrets (canaries, credentials) that occur in `text`."""
    return [s for s in secrets if s and s in text]


def dump(objects: list[Any]) -> str:
    return json.dumps(objects, default=str)


CANARIES = ["hf_canaryTOKEN0000000000000000000000", "AKIACANARY0000000000", "canary-secret-value-8d1f"]


def catalog_pools() -> list[GPUNodePool]:
    docs = yaml.safe_load_all((REPO / "examples" / "gpunodepools.yaml").read_text())
    return [GPUNodePool.model_validate(d) for d in docs if d]


def builder_violations(raw: dict[str, Any], pools: list[GPUNodePool]) -> list[str]:
    """Plan `raw` on the example pools and check the profiling and training Jobs memfit would create."""
    owner = Owner(name="job", namespace="team-a", uid="uid-1")
    pod = PodSettings(image="memfit-trainer:1")
    spec = MemoryOptimizedTrainingJobSpec.model_validate(raw)
    profile = Profile(problem_hash="h", shape=shape_from_problem(spec.problem))
    outcome = plan_job(
        spec=spec,
        profile=profile,
        pools=pools,
        capacity={},
        excluded_pools=frozenset(),
        observations=(),
        attempt=0,
        job_name=owner.name,
        catalog=CATALOG,
    )
    if outcome.plan is None:
        return [f"no plan: {outcome.message()}"]
    pool = next(p for p in pools if p.metadata.name == outcome.plan.node_pool)
    placement = Placement(pool.metadata.name, dict(pool.spec.node_selector), tuple(pool.spec.tolerations))
    train = build_training_job(owner=owner, spec=spec, plan=outcome.plan, placement=placement, pod=pod)
    profiling = build_profile_job(
        owner=owner, problem_hash="h", placement=placement, pod=pod, timeout_seconds=600
    )
    return pod_violations(train, namespace=owner.namespace) + pod_violations(
        profiling, namespace=owner.namespace
    )


def restricted_run(cc: ChaosCluster, log: Path) -> dict[str, Any]:
    """Two jobs (cached profile; profiled) in a `restricted` namespace, with canaries in the operator's
    environment and in a Secret of the namespace. Returns what was checked and what was found."""
    kube = cc.kube
    namespace = f"restricted-{uuid.uuid4().hex[:5]}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    kube.core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
    kube.wait(
        "default ServiceAccount",
        lambda: kube.raw(kube.core.read_namespaced_service_account, "default", namespace),
        60,
    )
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "canary"}, "stringData": {"token": CANARIES[2]}}
    )
    saved = {k: os.environ.get(k) for k in ("HF_TOKEN", "AWS_ACCESS_KEY_ID")}
    os.environ.update(HF_TOKEN=CANARIES[0], AWS_ACCESS_KEY_ID=CANARIES[1])
    try:
        op = operator_for(cc, namespace, log, extra=("--verbose",))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    custom = client.CustomObjectsApi(kube.api_client)
    names = ("cached", "profiled")
    try:
        seed_profile(cc.api, namespace, quickstart("seed"))
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, quickstart("cached"))
        profiled = quickstart("profiled", profiling={"reuse": False, "timeoutSeconds": 300})
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, profiled)

        def phases() -> list[str]:
            return [
                str(
                    (
                        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, n).get("status")
                        or {}
                    ).get("phase")
                )
                for n in names
            ]

        kube.wait("both jobs finished", lambda: all(p in ("Succeeded", "Failed") for p in phases()), 120)
    finally:
        op.check_crash()
        crashes, tracebacks = len(op.crashes), op.tracebacks()
        op.stop()
    pods = kube.pods(namespace, "app.kubernetes.io/managed-by=memfit")
    jobs = (kube.raw(kube.batch.list_namespaced_job, namespace) or {}).get("items", [])
    violations = [v for obj in [*pods, *jobs] for v in pod_violations(obj, namespace=namespace)]
    user = yaml.safe_load(cc.kubeconfig.read_text())["users"][0]["user"]
    key_lines = base64.b64decode(user["client-key-data"]).decode().splitlines()[1:3]
    secrets = [*CANARIES, user["client-key-data"][:40], *key_lines]
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
    return {
        "namespace_enforces": "restricted",
        "phases": phases(),
        "pods_admitted": len(pods),
        "jobs": len(jobs),
        "pod_violations": violations,
        "secrets_in_objects": find_secrets(written, secrets),
        "secrets_in_operator_log": find_secrets(log.read_text(), secrets),
        "operator_crashes": crashes,
        "operator_tracebacks": tracebacks,
    }

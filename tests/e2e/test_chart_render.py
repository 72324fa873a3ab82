"""`helm lint` and `helm template` of charts/memfit for the defaults and every ci/*-values.yaml variant."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_chart import VARIANTS, Rendered, load_values, render_variant
from e2e_podsecurity import restricted_violations
from e2e_rbac import expected_cluster, expected_namespaced, grants, grants_of
from e2e_tools import CHART, KUBE_VERSION, run

STANDARD_LABELS = ("helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of")
RBAC_KINDS = ("ClusterRole", "Role")


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def rendered(helm: Path, variant: str) -> Rendered:
    return render_variant(helm, variant)


def test_helm_lint_strict(helm: Path, variant: str) -> None:
    args = [] if variant == "defaults" else ["-f", str(CHART / "ci" / f"{variant}-values.yaml")]
    result = run([helm, "lint", CHART, "--strict", "--kube-version", KUBE_VERSION, *args])
    assert "0 chart(s) failed" in result.stdout


def test_every_object_has_the_standard_labels(rendered: Rendered) -> None:
    for obj in rendered.objects:
        labels = obj["metadata"].get("labels", {})
        absent = [k for k in STANDARD_LABELS if k not in labels]
        assert not absent, f"{obj['kind']}/{obj['metadata']['name']} lacks {absent}"
        assert labels["app.kubernetes.io/instance"] == "memfit"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_operator_deployment(rendered: Rendered, variant: str) -> None:
    values = load_values(variant)
    dep = rendered.one("Deployment", "memfit")
    assert dep["metadata"]["namespace"] == "memfit-system"
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "memfit"
    (container,) = pod["containers"]
    assert container["command"] == ["memfit"]
    args = container["args"]
    assert args[:3] == ["operator", "--metrics-port", "8080"]
    watched = [args[i + 1] for i, a in enumerate(args) if a == "--namespace"]
    assert watched == values["operator"]["watchNamespaces"]
    assert "--pod-group" not in args  # removed: gang admission is Kueue's (docs/kueue.md)
    env = {e["name"]: e.get("value") for e in container["env"]}
    expected_trainer = ("memfit/trainer:0.1.0" if not values["trainer"]["image"]["digest"]
                        else f"memfit/trainer@{values['trainer']['image']['digest']}")
    assert env["MEMFIT_TRAINER_IMAGE"] == expected_trainer
    assert env["MEMFIT_IMAGE_PULL_POLICY"] == "IfNotPresent"
    assert env["MEMFIT_POD_FS_GROUP"] == str(values["trainer"]["fsGroup"])  # digits, whatever its size
    assert env["MEMFIT_POD_FS_GROUP_CHANGE_POLICY"] == values["trainer"]["fsGroupChangePolicy"]
    assert env["MEMFIT_WORKERS"] == str(values["operator"]["workers"])
    digest = values["image"]["digest"]
    assert container["image"] == (f"memfit/operator@{digest}" if digest else "memfit/operator:0.1.0")
    assert container["ports"] == [{"name": "http-metrics", "containerPort": 8080, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert container["resources"]["limits"] == {"memory": "512Mi"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_pods_meet_restricted_pod_security(rendered: Rendered) -> None:
    specs = dict(rendered.pod_specs())
    assert "memfit" in specs and "memfit-test-metrics" in specs, specs.keys()
    for name, spec in specs.items():
        assert restricted_violations(spec) == [], name
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_helm_test_hook(rendered: Rendered) -> None:
    pod = rendered.one("Pod", "memfit-test-metrics")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["command"][-1]
    assert "http://memfit-metrics.memfit-system.svc:8080" in script
    assert "memfit_build_info" in script


def test_rbac_has_no_wildcards_and_no_secrets(rendered: Rendered) -> None:
    roles = [o for o in rendered.objects if o["kind"] in RBAC_KINDS]
    assert roles
    for role in roles:
        for group, resource, verb in grants_of(role["rules"]):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert resource != "secrets", role["metadata"]["name"]
        assert all("resourceNames" not in r and "nonResourceURLs" not in r for r in role["rules"])


def test_rbac_grants_exactly_what_the_operator_needs(rendered: Rendered, variant: str) -> None:
    values = load_values(variant)
    namespaces = values["operator"]["watchNamespaces"]
    cluster_role = rendered.one("ClusterRole", "memfit")
    namespaced = grants(expected_namespaced(values))
    if namespaces:
        assert grants_of(cluster_role["rules"]) == grants(expected_cluster(values))
        roles = {r["metadata"]["namespace"]: r for r in rendered.kind("Role")}
        assert sorted(roles) == sorted(namespaces)
        for role in roles.values():
            assert grants_of(role["rules"]) == namespaced
        bindings = {b["metadata"]["namespace"]: b for b in rendered.kind("RoleBinding")}
        assert sorted(bindings) == sorted(namespaces)
        for binding in bindings.values():
            assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "memfit"}
    else:
        assert grants_of(cluster_role["rules"]) == grants(expected_cluster(values)) | namespaced
        assert not rendered.kind("Role") and not rendered.kind("RoleBinding")
    crb = rendered.one("ClusterRoleBinding", "memfit")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "memfit", "namespace": "memfit-system"}]
    sa = rendered.one("ServiceAccount", "memfit")
    assert sa["metadata"]["namespace"] == "memfit-system"


def test_gpu_node_pools_from_values(rendered: Rendered, variant: str) -> None:
    from memfit.api.pool import GPUNodePool

    values = load_values(variant)
    pools = rendered.kind("GPUNodePool")
    assert [p["metadata"]["name"] for p in pools] == [p["name"] for p in values["gpuNodePools"]]
    for pool, wanted in zip(pools, values["gpuNodePools"], strict=True):
        GPUNodePool.model_validate(pool)  # the operator's own model accepts what the chart renders
        assert pool["spec"] == wanted["spec"]
        annotations = pool["metadata"]["annotations"]
        # helm template knows no GPUNodePool API: rendered as the first install's post-install hook, with
        # the ownership metadata that lets the next upgrade adopt it.
        assert annotations["helm.sh/hook"] == "post-install"
        assert annotations["meta.helm.sh/release-name"] == "memfit"
        assert annotations["meta.helm.sh/release-namespace"] == "memfit-system"
        for key, value in wanted.get("labels", {}).items():
            assert pool["metadata"]["labels"][key] == value


def test_pools_become_release_objects_once_the_api_exists(helm: Path) -> None:
    from e2e_chart import helm_template, values_file

    rendered, _ = helm_template(helm, "-f", str(values_file("pools")), "--api-versions",
                                "memfit.dev/v1alpha1/GPUNodePool")
    for pool in rendered.kind("GPUNodePool"):
        assert "helm.sh/hook" not in pool["metadata"]["annotations"]


def test_namespace_scoped_podmonitor_selects_only_watched_namespaces(helm: Path) -> None:
    from e2e_chart import helm_template, values_file

    rendered, _ = helm_template(helm, "-f", str(values_file("namespace-scoped")), "--set", "podMonitor.enabled=true")
    monitor = rendered.one("PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml-team-a", "ml-team-b"]}


def test_kueue_flavors_from_pool_values_equal_memfits_own(helm: Path) -> None:
    """kueue.flavors renders, per gpuNodePools entry, the ResourceFlavor `memfit kueue flavors` builds for
    that pool (same nodeLabels and tolerations), so memfit's nodeSelector and Kueue's flavor agree."""
    from e2e_chart import helm_template, values_file
    from memfit.api.pool import GPUNodePool
    from memfit.kube.kueue import build_kueue_setup, build_resource_flavor

    for variant in ("pools", "mig-pools"):  # mig-pools: a whole-GPU pool and two MIG pools over the same nodes
        args = ["-f", str(values_file(variant)), "--set", "kueue.flavors=true"]
        rendered, _ = helm_template(helm, *args, "--api-versions", "kueue.x-k8s.io/v1beta2/ResourceFlavor")
        flavors = rendered.kind("ResourceFlavor")
        values = load_values(variant)["gpuNodePools"]
        assert [f["metadata"]["name"] for f in flavors] == [p["name"] for p in values]
        models = [GPUNodePool.model_validate({"apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool",
                                             "metadata": {"name": p["name"]}, "spec": p["spec"]}) for p in values]
        for flavor, model in zip(flavors, models, strict=True):
            assert flavor["spec"] == build_resource_flavor(model)["spec"], flavor
            assert flavor["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        assert [d["kind"] for d in build_kueue_setup(models)][-2:] == ["ClusterQueue", "LocalQueue"]  # not refused
    args = ["-f", str(values_file("pools")), "--set", "kueue.flavors=true"]
    # Without Kueue's API in the cluster, or without pools, the install fails saying why.
    _, stderr = helm_template(helm, *args, check=False)
    assert "kueue.flavors: Kueue's ResourceFlavor API (kueue.x-k8s.io/v1beta2) is not in the cluster" in stderr
    _, stderr = helm_template(helm, "--set", "kueue.flavors=true", "--api-versions",
                              "kueue.x-k8s.io/v1beta2/ResourceFlavor", check=False)  # fmt: skip
    assert "kueue.flavors: gpuNodePools is empty" in stderr
    assert not render_variant(helm, "pools").kind("ResourceFlavor")  # off by default


def test_kueue_admission_check_renders_the_check_its_rbac_and_the_interval(helm: Path) -> None:
    """kueue.admissionCheck renders the memfit.dev/memory-fit AdmissionCheck, turns the controller on
    (MEMFIT_ADMISSION_CHECK_SECONDS) and grants what it reads and patches, cluster-wide; without Kueue's
    API the install fails saying why."""
    from e2e_chart import helm_template
    from e2e_rbac import ADMISSION_CHECK, grants, grants_of

    args = ["--set", "kueue.admissionCheck.enabled=true", "--set", "kueue.admissionCheck.intervalSeconds=3"]
    rendered, _ = helm_template(helm, *args, "--api-versions", "kueue.x-k8s.io/v1beta2/AdmissionCheck")
    (check,) = rendered.kind("AdmissionCheck")
    assert check["metadata"]["name"] == "memfit-memory-fit"
    assert check["spec"] == {"controllerName": "memfit.dev/memory-fit"}
    (deployment,) = rendered.kind("Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MEMFIT_ADMISSION_CHECK_SECONDS"] == "3"
    (role,) = rendered.kind("ClusterRole")
    assert grants(ADMISSION_CHECK) <= grants_of(role["rules"])
    _, stderr = helm_template(helm, *args, check=False)
    assert "kueue.admissionCheck: Kueue's AdmissionCheck API (kueue.x-k8s.io/v1beta2) is not in the cluster" in stderr
    default, _ = helm_template(helm)
    assert not default.kind("AdmissionCheck")
    env = {e["name"] for e in default.kind("Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "MEMFIT_ADMISSION_CHECK_SECONDS" not in env

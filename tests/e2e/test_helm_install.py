"""`helm install` of charts/memfit into the real local cluster: objects accepted by the API server, the
operator pod scheduled on a KWOK node of a namespace enforcing PodSecurity "restricted", a `kubectl auth
can-i` matrix for its ServiceAccount (cluster-wide and namespace-scoped), upgrade and uninstall."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from e2e_chart import values_file
from e2e_cluster import Cluster, wait_for
from e2e_rbac import CLUSTER, DENIED, KUEUE, KUEUE_CLUSTER, NAMESPACED, can_i_args, matrix
from e2e_tools import CHART

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NS = "memfit-system"
SA = f"system:serviceaccount:{NS}:memfit"
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}
BAD_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root-pod"},
           "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "securityContext": {"privileged": True}}]}}


def create_namespace(cluster: Cluster, name: str, labels: dict[str, str] | None = None) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(ns))


def check_matrix(cluster: Cluster, user: str, cases: list[tuple[str, list[str], str | None, bool]]) -> None:
    """cases: (verb, can-i resource args, namespace or None for all namespaces, expected answer)."""
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda c: cluster.can_i(user, c[0], c[1], c[2]), cases))
    wrong = [f"{'allowed' if got else 'denied'} (expected {'allowed' if want else 'denied'}): {verb} "
             f"{' '.join(res)} in {ns or 'all namespaces'}"
             for (verb, res, ns, want), got in zip(cases, answers, strict=True) if got != want]
    assert not wrong, "\n".join(wrong)


@pytest.fixture(scope="module")
def release(e2e_cluster: Cluster) -> Iterator[Cluster]:
    """Release "memfit" in a restricted namespace: CRDs (kept), two GPUNodePools from values."""
    create_namespace(e2e_cluster, NS, RESTRICTED)
    e2e_cluster.helm_run("install", "memfit", CHART, "-n", NS, "-f", values_file("pools"),
                         "--set", "crds.keep=true", "--wait", "--timeout", "180s")
    yield e2e_cluster
    e2e_cluster.helm_run("uninstall", "memfit", "-n", NS, "--wait", check=False)


def test_objects_accepted(release: Cluster) -> None:
    manifest = release.helm_run("get", "manifest", "memfit", "-n", NS).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    names = release.kubectl("get", "-f", "-", "-o", "name", stdin=manifest).stdout.split()
    assert len(names) == len(docs) >= 8
    for crd in ("memoryoptimizedtrainingjobs.memfit.dev", "gpunodepools.memfit.dev"):
        obj = release.get("crd", crd)
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert any(c["type"] == "Established" and c["status"] == "True" for c in obj["status"]["conditions"])
    pools = {p["metadata"]["name"]: p for p in release.get("gpunodepools")["items"]}
    assert sorted(pools) == ["a100-80", "t4-spot"]
    assert pools["t4-spot"]["spec"]["pricePerNodeHour"] == 0.22
    assert pools["t4-spot"]["metadata"]["labels"]["memfit.dev/tier"] == "cheap"


def test_operator_pod_runs_on_a_kwok_node_under_restricted_pod_security(release: Cluster) -> None:
    def running() -> dict[str, object] | None:
        pods = release.get("pods", "-n", NS, "-l", "app.kubernetes.io/component=operator")["items"]
        return pods[0] if len(pods) == 1 and pods[0]["status"].get("phase") == "Running" else None

    pod = wait_for("the operator pod Running", running, timeout=60)
    node = release.get("node", pod["spec"]["nodeName"])  # type: ignore[index]
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]  # the operator needs no GPU
    ns = release.get("namespace", NS)
    assert RESTRICTED.items() <= ns["metadata"]["labels"].items()
    # Control: the same namespace refuses a privileged pod, so the enforcement above was real.
    refused = release.kubectl("apply", "--dry-run=server", "-n", NS, "-f", "-", stdin=yaml.safe_dump(BAD_POD),
                              check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr


def test_rbac_matrix_cluster_wide(release: Cluster) -> None:
    cases = [(verb, can_i_args(g, r), "ml-anywhere" if (g, r) in NAMESPACED else None, allowed)
             for g, r, verb, allowed in matrix(dict(NAMESPACED) | dict(CLUSTER))]
    cases += [(verb, can_i_args(g, r), None, allowed) for g, r, verb, allowed in matrix(NAMESPACED)
              if verb in ("list", "watch")]
    cases += [(verb, [res], ns, False) for verb, res in DENIED for ns in ("ml-anywhere", NS)]
    cases += [(verb, can_i_args(g, r), "ml-anywhere", False) for g, r, verb, _ in matrix(KUEUE)]
    cases += [(verb, can_i_args(g, r), None, False) for g, r, verb, _ in matrix(KUEUE_CLUSTER)]
    check_matrix(release, SA, cases)


def test_rbac_matrix_namespace_scoped(release: Cluster) -> None:
    for name in ("ml-team-a", "ml-team-b", "ml-team-c"):
        create_namespace(release, name)
    create_namespace(release, "memfit-scoped", RESTRICTED)
    release.helm_run("install", "memfit-ns", CHART, "-n", "memfit-scoped", "-f", values_file("namespace-scoped"),
                     "--set", "crds.enabled=false", "--wait", "--timeout", "180s")
    try:
        dep = release.get("deployment", "memfit-ns", "-n", "memfit-scoped")
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[-4:] == ["--namespace", "ml-team-a", "--namespace", "ml-team-b"]
        user = "system:serviceaccount:memfit-scoped:memfit-ns"
        namespaced = dict(NAMESPACED) | dict(KUEUE)
        cases = [(verb, can_i_args(g, r), ns, allowed) for g, r, verb, allowed in matrix(namespaced)
                 for ns in ("ml-team-a", "ml-team-b")]
        # Other namespaces, including its own and the cluster-wide view: nothing namespaced.
        cases += [(verb, can_i_args(g, r), ns, False) for g, r, verb, _ in matrix(namespaced)
                  for ns in ("ml-team-c", "memfit-scoped", None) if verb in ("get", "list", "create", "delete")]
        cases += [(verb, can_i_args(g, r), None, allowed)
                  for g, r, verb, allowed in matrix(dict(CLUSTER) | dict(KUEUE_CLUSTER))]
        cases += [(verb, [res], "ml-team-a", False) for verb, res in DENIED]
        check_matrix(release, user, cases)
    finally:
        release.helm_run("uninstall", "memfit-ns", "-n", "memfit-scoped", "--wait", check=False)


def test_upgrade_adopts_pools_then_uninstall_keeps_crds(release: Cluster, tmp_path: Path) -> None:
    """Runs last in this module: upgrades twice and uninstalls the release."""
    values = yaml.safe_load(values_file("pools").read_text())
    values["gpuNodePools"][0]["spec"]["pricePerNodeHour"] = 0.19
    del values["gpuNodePools"][1]
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))

    def upgrade() -> tuple[dict[str, dict[str, object]], str]:
        notes = release.helm_run("upgrade", "memfit", CHART, "-n", NS, "-f", tmp_path / "values.yaml",
                                 "--set", "crds.keep=true", "--wait", "--timeout", "180s").stdout
        return {p["metadata"]["name"]: p for p in release.get("gpunodepools")["items"]}, notes

    pools, notes = upgrade()  # revision 2 adopts t4-spot as it is in the cluster
    assert sorted(pools) == ["a100-80", "t4-spot"]  # a100-80 was a hook object: not the release's to delete
    assert "name: t4-spot" in release.helm_run("get", "manifest", "memfit", "-n", NS).stdout
    assert pools["t4-spot"]["spec"]["pricePerNodeHour"] == 0.22  # type: ignore[index]
    assert "This upgrade adopted the pools the install created (t4-spot)" in notes
    pools, notes = upgrade()  # revision 3: a release object, patched from the adopted state to the values
    assert pools["t4-spot"]["spec"]["pricePerNodeHour"] == 0.19  # type: ignore[index]
    assert "adopted" not in notes
    release.kubectl("delete", "gpunodepool", "a100-80")

    release.helm_run("uninstall", "memfit", "-n", NS, "--wait")
    assert release.kubectl("get", "deployment", "memfit", "-n", NS, check=False).returncode != 0
    assert release.get("gpunodepools")["items"] == []  # t4-spot belonged to the release
    for crd in ("memoryoptimizedtrainingjobs.memfit.dev", "gpunodepools.memfit.dev"):
        assert release.get("crd", crd)["metadata"]["name"] == crd  # kept

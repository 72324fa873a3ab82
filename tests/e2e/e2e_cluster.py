"""The local test cluster for the e2e tier (memfit_testbed.testcluster: etcd, kube-apiserver, controller-manager,
scheduler, KWOK GPU pools, local pod runner), and kubectl/helm against it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e_tools import missing, run


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    helm: Path

    @property
    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        if stdin is None:
            return run(["kubectl", *args], check=check, env=self.env)
        result = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120,
                                env={**os.environ, **self.env})
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result

    def get(self, *args: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", *args, "-o", "json").stdout))

    def helm_run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.helm, *args], check=check, env=self.env, timeout=300)

    def can_i(self, user: str, verb: str, resource: list[str], namespace: str | None) -> bool:
        """`kubectl auth can-i VERB RESOURCE [--subresource=S] --as USER` in a namespace or cluster-wide. For
        an API the server does not serve (Kueue, scheduler-plugins) kubectl would ask about the wrong group,
        so those go to a SubjectAccessReview with the same attributes."""
        scope = ["-n", namespace] if namespace else ["--all-namespaces"]
        result = self.kubectl("auth", "can-i", verb, *resource, "--as", user, *scope, check=False)
        if "doesn't have a resource type" in result.stderr:
            return self.access_review(user, verb, resource, namespace)
        answer = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        assert answer in ("yes", "no"), f"can-i {verb} {resource}: {result.stdout} {result.stderr}"
        return answer == "yes"

    def access_review(self, user: str, verb: str, resource: list[str], namespace: str | None) -> bool:
        name, _, group = resource[0].partition(".")
        attrs = {"verb": verb, "group": group, "resource": name, "namespace": namespace or ""}
        for arg in resource[1:]:
            attrs["subresource"] = arg.removeprefix("--subresource=")
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "resourceAttributes": attrs}}
        out = self.kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(review)).stdout
        return bool(json.loads(out)["status"].get("allowed"))


def wait_for(what: str, ok: Callable[[], Any], timeout: float = 60, logs: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = ok()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs()}")
        time.sleep(0.5)


@contextlib.contextmanager
def start_cluster(workdir: Path) -> Iterator[Any]:
    """Start a TestCluster with the KWOK pools in hack/kwok/gpu-pools.yaml; skip (or fail under
    MEMFIT_REQUIRE_CLUSTER) when its binaries are missing."""
    from memfit_testbed import kwok_pools, testcluster

    bin_dir = testcluster.find_bin_dir()
    if absent := testcluster.missing_binaries(bin_dir):
        missing(f"test cluster binaries missing: {absent} in {bin_dir}; run hack/install-testbin.sh")
    cluster = testcluster.TestCluster(workdir=workdir, bin_dir=bin_dir, pod_runner=True, die_with_parent=True)
    cluster.start()
    try:
        kwok_pools.apply_pools(str(cluster.kubeconfig))
        yield cluster
    finally:
        cluster.stop()

"""Shared fixtures: repo paths, and one real local cluster per test run (integration and e2e tiers)."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest
from kubernetes import config
from memfit_testbed import kueue as testbed_kueue
from memfit_testbed import kwok_pools, testcluster
from memfit_testbed.cluster_helpers import Kube

REPO = Path(__file__).resolve().parent.parent

_STARTED: list[testcluster.TestCluster] = []


def _require() -> bool:
    return os.environ.get("MEMFIT_REQUIRE_CLUSTER", "") not in ("", "0")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testcluster.TestCluster]:
    """A real control plane + kwok + pod runner + GPU pools, started once per test run."""
    try:
        bin_dir = testcluster.find_bin_dir()
        missing = testcluster.missing_binaries(bin_dir)
    except (OSError, subprocess.CalledProcessError) as e:
        bin_dir, missing = Path("?"), [f"bin dir ({e})"]
    if missing:
        msg = f"test cluster binaries missing: {missing} in {bin_dir}; run hack/install-testbin.sh"
        if _require():
            pytest.fail(f"{msg} (MEMFIT_REQUIRE_CLUSTER is set)", pytrace=False)
        pytest.skip(msg)
    workdir = tmp_path_factory.mktemp("testcluster")
    c = testcluster.TestCluster(workdir=workdir, bin_dir=bin_dir, pod_runner=True, die_with_parent=True)
    secs = c.start()
    _STARTED.append(c)
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(c.kubeconfig)
    try:
        nodes = kwok_pools.apply_pools(str(c.kubeconfig))
        print(f"\ntest cluster up in {secs:.1f}s at {c.server} with {len(nodes)} kwok nodes ({workdir})")
        yield c
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
        c.stop()
        _STARTED.remove(c)


@pytest.fixture(scope="session")
def kube(cluster: testcluster.TestCluster) -> Kube:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    return Kube(api_client=api, logs=lambda: cluster.log_tail(40))


@pytest.fixture
def new_namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    """Factory: create a namespace (optionally labelled), wait for its default ServiceAccount; all are
    deleted after the test."""
    made: list[str] = []
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")

    def make(labels: dict[str, str] | None = None) -> str:
        name = f"{base}-{uuid.uuid4().hex[:5]}"
        kube.core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
        made.append(name)
        kube.wait(f"default ServiceAccount in {name}",
                  lambda: kube.raw(kube.core.read_namespaced_service_account, "default", name), timeout=30)
        return name

    yield make
    for name in made:
        kube.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def namespace(new_namespace: Callable[..., str]) -> str:
    """A fresh namespace per test."""
    return new_namespace()


@pytest.fixture(scope="session")
def install_crds(cluster: testcluster.TestCluster) -> list[str]:
    """Apply every YAML in crds/ (server-side) and wait until the CRDs are Established; their names."""
    files = sorted((REPO / "crds").glob("*.y*ml"))
    if not files:
        pytest.skip("no CRDs in crds/")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    args = ["kubectl", "apply", "--server-side", "--force-conflicts", "-o", "name"]
    for f in files:
        args += ["-f", str(f)]
    out = subprocess.run(args, check=True, env=env, capture_output=True, text=True).stdout.split()
    names = [n for n in out if n.startswith("customresourcedefinition")]
    subprocess.run(["kubectl", "wait", "--for=condition=Established", "--timeout=60s", *names],
                   check=True, env=env, capture_output=True)
    return [n.split("/", 1)[1] for n in names]


@pytest.fixture(scope="module")
def kueue(
    cluster: testcluster.TestCluster, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[testbed_kueue.KueueManager]:
    """The real Kueue manager (hack/install-testbin.sh builds it) on the session's cluster, for one test
    module; stopping it removes its webhook configurations, so later modules create Jobs as before.
    A module's `KUEUE_PODS_READY_TIMEOUT` (seconds) turns WaitForPodsReady on; its
    `KUEUE_DEVICE_CLASS_MAPPINGS` is Kueue's `resources.deviceClassMappings` (DRA quota).
    Missing Kueue skips (fails with MEMFIT_REQUIRE_CLUSTER=1)."""
    try:
        kueue_dir = testbed_kueue.find_kueue_dir()
        why = testbed_kueue.missing_kueue(kueue_dir)
    except (OSError, subprocess.CalledProcessError) as e:
        kueue_dir, why = Path("?"), f"Kueue folder ({e})"
    if why:
        if _require():
            pytest.fail(f"{why} (MEMFIT_REQUIRE_CLUSTER is set)", pytrace=False)
        pytest.skip(why)
    workdir = tmp_path_factory.mktemp("kueue")
    timeout = getattr(request.module, "KUEUE_PODS_READY_TIMEOUT", None)
    mappings = getattr(request.module, "KUEUE_DEVICE_CLASS_MAPPINGS", ())
    with testbed_kueue.running_kueue(cluster.kubeconfig, workdir, kueue_dir=kueue_dir,
                                     pods_ready_timeout=timeout, device_class_mappings=mappings) as manager:
        yield manager


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failing test that used the cluster, attach the component logs to the report."""
    report = yield
    if report.failed and _STARTED and "cluster" in getattr(item, "fixturenames", ()):
        report.sections.append(("test cluster logs", _STARTED[-1].log_tail(60)))
    manager = getattr(item, "funcargs", {}).get("kueue")
    if report.failed and isinstance(manager, testbed_kueue.KueueManager):
        alive = "running" if manager.running() else "NOT running"
        report.sections.append((f"kueue log (manager {alive})", manager.log_tail(60)))
    return report


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO

"""The real-node tier: a test cluster with one real node (kubelet + containerd + CNI + kube-proxy + CoreDNS)
running the images built from the project's Dockerfiles (docs/realnode.md). Skipped, with the reason
printed, where the machine cannot run a real node; the pod-runner tiers cover the rest."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config
from memfit_testbed import testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.memfit_api import install_memfit_api
from memfit_testbed.operator_helpers import operator_process
from memfit_testbed.realnode.cluster import real_node_cluster
from memfit_testbed.realnode.node import RealNode, unsupported_reason

pytestmark = pytest.mark.realnode


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/realnode/" in str(item.fspath):
            item.add_marker(pytest.mark.realnode)


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[testcluster.TestCluster, RealNode]]:
    """A control plane + KWOK pools + the real node standing in for `t4-spot`; everything stopped and
    every host change undone at the end."""
    if os.environ.get("MEMFIT_SKIP_REALNODE"):
        pytest.skip("real node: MEMFIT_SKIP_REALNODE is set")
    if reason := unsupported_reason():
        print(f"\nreal-node tier skipped: {reason}", file=sys.stderr)
        pytest.skip(f"real node not supported on this machine: {reason}")
    with real_node_cluster(tmp_path_factory.mktemp("realnode-cluster")) as (cluster, node, secs):
        print(f"\nreal node {node.node_name} Ready in {secs:.1f}s; images {node.images}", file=sys.stderr)
        yield cluster, node


@pytest.fixture(scope="session")
def rkube(real_cluster: tuple[testcluster.TestCluster, RealNode]) -> Kube:
    cluster, _ = real_cluster
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    return Kube(api_client=api, logs=lambda: cluster.log_tail(40))


@pytest.fixture(scope="session")
def rnode(real_cluster: tuple[testcluster.TestCluster, RealNode]) -> RealNode:
    return real_cluster[1]


@pytest.fixture(scope="session")
def rcrds(real_cluster: tuple[testcluster.TestCluster, RealNode]) -> None:
    """memfit's CRDs and the GPUNodePools of hack/kwok/gpunodepools.yaml, as `hack/testcluster up` installs them."""
    cluster, _ = real_cluster
    install_memfit_api(cluster.kubeconfig)


@pytest.fixture(scope="module")
def operator(real_cluster: Any, rnode: RealNode, rcrds: None, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Path]:
    """`memfit operator` as a host process (no pod-runner label): its pods go to the real node."""
    cluster, _ = real_cluster
    assert rnode.images is not None
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with operator_process(cluster.kubeconfig, log, pod_runner=False, trainer_image=rnode.images.trainer):
        yield log


@pytest.fixture
def rnamespace(rkube: Kube, request: pytest.FixtureRequest) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def make(labels: dict[str, str] | None = None) -> str:
        name = f"rn-{request.node.name.lower().replace('_', '-')[:40].strip('-')}-{len(made)}"
        rkube.core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})
        made.append(name)
        rkube.wait(f"default ServiceAccount in {name}",
                   lambda: rkube.raw(rkube.core.read_namespaced_service_account, "default", name), timeout=30)
        return name

    yield make
    for name in made:
        rkube.core.delete_namespace(name, propagation_policy="Background")

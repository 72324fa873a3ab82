"""A test cluster with the real node: control plane + KWOK pools + one real kubelet node standing in for
`t4-spot` (docs/realnode.md). The real-node tier and the reliability campaign's real-node section share it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memfit_testbed import kwok_pools, testcluster
from memfit_testbed.realnode import hostchanges
from memfit_testbed.realnode.node import RealNode


@contextmanager
def real_node_cluster(workdir: Path) -> Iterator[tuple[testcluster.TestCluster, RealNode, float]]:
    """(cluster, node, seconds the node took to be Ready); everything stopped and every host change undone
    on exit, which fails if any is left."""
    cluster = testcluster.TestCluster(workdir=workdir, pod_runner=False, die_with_parent=True)
    cluster.start()
    node = RealNode(cluster_dir=workdir, apiserver_port=cluster.ports["apiserver"])
    try:
        kwok_pools.apply_pools(str(cluster.kubeconfig))
        ready = node.start()
        yield cluster, node, ready
    finally:
        node.stop()
        cluster.stop()
        left = hostchanges.remaining()
        if left:
            raise AssertionError(f"the real node left host changes behind: {left}")

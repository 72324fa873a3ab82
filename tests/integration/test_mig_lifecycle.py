"""MIG slices as capacity, through the operator (issue #33): a KWOK H100 node shows what NVIDIA's device
plugin shows with the `mixed` MIG strategy (one whole GPU, one GPU in seven 1g.10gb slices, one in two
3g.40gb slices: three extended resources). Three GPUNodePools over it, one per kind of device. A small job
plans onto a 1g.10gb slice, its profiling and training pods request `nvidia.com/mig-1g.10gb`, the real
scheduler places them on the node's slices, the trainer runs (pod runner) and the job Succeeds; each
pool's status counts its own resource. The API server refuses a pool with more slices than a GPU has,
naming the field (the CRD's CEL rule)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.kwok_pools import Gpu, MigSlices, Pool, delete_pool, scale_pool
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import operator

__all__ = ["operator"]  # the module operator fixture, imported
pytestmark = [pytest.mark.cluster, pytest.mark.slow]
GROUP, VERSION = "memfit.dev", "v1alpha1"
H100 = "NVIDIA-H100-80GB-HBM3"
NODE_POOL = "h100-mig"  # the KWOK nodes' memfit.dev/pool label
POOLS = {"h100-whole": None, "h100-1g": {"profile": "1g.10gb"}, "h100-3g": {"profile": "3g.40gb", "perGPU": 2}}
TIMEOUT = 300.0


def _pool(name: str, mig: dict[str, Any] | None, **gpu: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNodePool", "metadata": {"name": name},
            "spec": {"gpu": {"product": H100, "perNode": 1, **({"mig": mig} if mig else {}), **gpu},
                     "nodeSelector": {"memfit.dev/pool": NODE_POOL}, "pricePerNodeHour": 6.88, "maxNodes": 1,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}



@pytest.fixture(scope="module")
def mig_node(kube: Kube, operator: Path) -> Iterator[None]:
    """One KWOK node partitioned as above, and the three pools; gone after the module."""
    slices = (MigSlices("1g.10gb", 7, 9856), MigSlices("3g.40gb", 2, 40192))
    node = Pool(name=NODE_POOL, nodes=1, instance_type="p5.48xlarge", capacity_type="on-demand", cpu="16",
                memory="64Gi", gpu=Gpu(product=H100, memory_mib=81559, count=1, mig=slices))
    scale_pool(kube.core, node, 1)
    custom = client.CustomObjectsApi(kube.api_client)
    for name, mig in POOLS.items():
        custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", _pool(name, mig))
    try:
        yield
    finally:
        for name in POOLS:
            custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodepools", name)
        delete_pool(kube.core, NODE_POOL)


def _limits(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"]["limits"])


def test_a_small_job_runs_on_a_slice_and_each_pool_counts_its_own_slices(
    kube: Kube, namespace: str, operator: Path, mig_node: None
) -> None:
    doc = quickstart("on-a-slice", placement={"maxNodes": 1, "nodePools": list(POOLS)})
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, "on-a-slice", ("Succeeded", "Failed"), TIMEOUT, operator)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    plan = status["plan"]
    assert (plan["nodePool"], plan["gpus"]) == ("h100-1g", 1), plan
    assert plan["gpuProduct"] == f"{H100}-MIG-1g.10gb"
    whole = 6.88
    assert plan["costPerHour"] == pytest.approx(whole / 7, rel=1e-3)

    pods = kube.pods(namespace, "memfit.dev/job=on-a-slice")
    by_component = {p["metadata"]["labels"]["memfit.dev/component"]: p for p in pods}
    for component in ("profiler", "trainer"):
        pod = by_component[component]
        assert _limits(pod) == {"nvidia.com/mig-1g.10gb": "1"}, (component, _limits(pod))
        assert pod["spec"]["nodeName"] == f"{NODE_POOL}-0"

    custom = client.CustomObjectsApi(kube.api_client)
    allocatable = {name: custom.get_cluster_custom_object(GROUP, VERSION, "gpunodepools", name)
                   .get("status", {}).get("allocatableGpus") for name in POOLS}
    assert allocatable == {"h100-whole": 1, "h100-1g": 7, "h100-3g": 2}, allocatable


@pytest.mark.parametrize(
    ("mig", "field"),
    [({"profile": "3g.40gb", "perGPU": 3}, "gpu.mig.perGPU"),
     ({"profile": "1g.10gb", "perGPU": 7, "computeFraction": 0.5}, "gpu.mig.computeFraction"),
     ({"profile": "one-slice"}, "spec.gpu.mig.profile")],
)
def test_the_api_server_refuses_an_impossible_mig_pool_naming_the_field(
    kube: Kube, install_crds: Any, mig: dict[str, Any], field: str
) -> None:
    custom = client.CustomObjectsApi(kube.api_client)
    with pytest.raises(client.exceptions.ApiException) as refused:
        custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", _pool("impossible-mig", mig))
    assert refused.value.status == 422
    assert field in str(refused.value.body), refused.value.body

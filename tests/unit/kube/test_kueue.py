"""Kueue objects from GPUNodePools (memfit.kube.kueue) and `memfit kueue flavors`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from memfit.api.pool import GPUNodePool
from memfit.cli import main
from memfit.kube.kueue import (
    KueueConfigError,
    build_cluster_queue,
    build_kueue_setup,
    build_resource_flavor,
)


def make_pool(name: str = "l4x4", **spec: Any) -> GPUNodePool:
    raw: dict[str, Any] = {
        "gpu": {"product": "NVIDIA-L4", "perNode": 4},
        "nodeSelector": {"node.kubernetes.io/instance-type": "g6.12xlarge", "karpenter.sh/capacity-type": "spot"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "maxNodes": 3,
    }
    raw.update(spec)
    return GPUNodePool.model_validate({"metadata": {"name": name}, "spec": raw})


def test_flavor_carries_the_pool_selector_and_tolerations() -> None:
    flavor = build_resource_flavor(make_pool())
    assert flavor["kind"] == "ResourceFlavor" and flavor["metadata"]["name"] == "l4x4"
    assert flavor["spec"]["nodeLabels"] == {"karpenter.sh/capacity-type": "spot",
                                           "node.kubernetes.io/instance-type": "g6.12xlarge"}
    assert flavor["spec"]["tolerations"] == [
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_flavor_needs_a_selector() -> None:
    with pytest.raises(KueueConfigError, match=r"GPUNodePool bare: spec.nodeSelector is empty"):
        build_resource_flavor(make_pool("bare", nodeSelector={}))


@pytest.mark.parametrize(
    ("quota", "expected"),
    [({}, 12), ({"l4x4": 4}, 4), ({"l4x4": 0}, 0)],
    ids=["default maxNodes x perNode", "explicit 4", "zero"],
)
def test_cluster_queue_gpu_quota(quota: dict[str, int], expected: int) -> None:
    cq = build_cluster_queue("team", [make_pool()], gpu_quota=quota)
    group = cq["spec"]["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    gpu = next(r for r in group["flavors"][0]["resources"] if r["name"] == "nvidia.com/gpu")
    assert group["flavors"][0]["name"] == "l4x4" and gpu["nominalQuota"] == expected


def test_quota_for_an_unknown_pool_is_refused() -> None:
    with pytest.raises(KueueConfigError, match="--gpu-quota: no GPUNodePool named t4 \\(pools: l4x4\\)"):
        build_cluster_queue("team", [make_pool()], gpu_quota={"t4": 1})


def test_setup_orders_flavors_then_queues() -> None:
    pools = [make_pool("b", nodeSelector={"pool": "b"}), make_pool("a", nodeSelector={"pool": "a"})]
    docs = build_kueue_setup(pools, cluster_queue="cq", local_queue="lq", namespace="ml")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ResourceFlavor", "a"), ("ResourceFlavor", "b"), ("ClusterQueue", "cq"), ("LocalQueue", "lq")]
    assert docs[-1]["metadata"]["namespace"] == "ml" and docs[-1]["spec"] == {"clusterQueue": "cq"}
    assert [f["name"] for f in docs[2]["spec"]["resourceGroups"][0]["flavors"]] == ["a", "b"]


def test_a_selector_contained_in_another_pool_is_refused() -> None:
    wide = make_pool("l4", nodeSelector={"gpu": "l4"})
    narrow = make_pool("l4-spot", nodeSelector={"gpu": "l4", "capacity": "spot"})
    with pytest.raises(KueueConfigError, match=r"GPUNodePool l4: spec.nodeSelector \{'gpu': 'l4'\} is contained in "
                       r"l4-spot's"):
        build_kueue_setup([wide, narrow])
    assert len(build_kueue_setup([narrow, make_pool("l4-od", nodeSelector={"gpu": "l4", "capacity": "od"})])) == 4


def _pools_file(tmp_path: Path) -> Path:
    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool",
                                    "metadata": {"name": "t4"},
                                    "spec": {"gpu": {"product": "Tesla-T4"}, "nodeSelector": {"pool": "t4"}}}))
    return path


def test_cli_prints_flavors_and_queues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kueue", "flavors", str(_pools_file(tmp_path)), "--gpu-quota", "t4=2", "-n", "ml"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs[0]["spec"]["nodeLabels"] == {"pool": "t4"}
    assert docs[1]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2] == {"name": "nvidia.com/gpu",
                                                                                  "nominalQuota": 2}
    assert docs[2]["metadata"] == {"name": "memfit", "namespace": "ml"}


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--gpu-quota", "t4=two"], "--gpu-quota 't4=two': expected POOL=GPUS"),
     (["--gpu-quota", "l4=1"], "--gpu-quota: no GPUNodePool named l4")],
    ids=["not a number", "unknown pool"],
)
def test_cli_bad_quota(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["kueue", "flavors", str(_pools_file(tmp_path)), *args]) == 2
    assert message in capsys.readouterr().err

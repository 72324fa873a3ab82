"""`memfit pools discover`: GFD node labels -> GPUNodePools with catalog defaults."""

from __future__ import annotations

from typing import Any

from memfit.api.pool import GPUNodePool, mig_problems
from memfit.kube.discover import discover_pools


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_groups_nodes_by_product_count_instance_and_capacity() -> None:
    nodes = [
        node(
            "a",
            **{
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "23034",
                "node.kubernetes.io/instance-type": "g6.12xlarge",
                "karpenter.sh/capacity-type": "spot",
            },
        ),
        node(
            "b",
            **{
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "23034",
                "node.kubernetes.io/instance-type": "g6.12xlarge",
                "karpenter.sh/capacity-type": "spot",
            },
        ),
        node("c", **{"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1"}),
        node("cpu", **{"node.kubernetes.io/instance-type": "m6i.large"}),
    ]
    pools = discover_pools(nodes)
    assert [p["metadata"]["name"] for p in pools] == ["l4-g6-12xlarge-spot", "t4"]
    l4 = pools[0]["spec"]
    assert l4["gpu"] == {"product": "NVIDIA-L4", "perNode": 4, "memoryMiB": 23034}
    assert l4["capacityType"] == "spot" and l4["maxNodes"] == 2
    assert l4["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert l4["pricePerNodeHour"] == round(0.805 * 4, 3)
    for pool in pools:
        GPUNodePool.model_validate(pool)  # every discovered pool is a valid GPUNodePool


def test_unknown_product_gets_no_price_but_a_valid_name() -> None:
    pools = discover_pools(
        [node("x", **{"nvidia.com/gpu.product": "NVIDIA-GB300", "nvidia.com/gpu.count": "8"})]
    )
    assert pools[0]["metadata"]["name"] == "nvidia-gb300-x8"
    assert "pricePerNodeHour" not in pools[0]["spec"]


def test_a_mixed_strategy_mig_node_gives_a_pool_per_profile_and_one_for_its_whole_gpus() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.10gb.count": "14", "nvidia.com/mig-1g.10gb.memory": "9856",
        "nvidia.com/mig-3g.40gb.count": "4", "nvidia.com/mig-3g.40gb.memory": "40192",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
    }
    mig_node = node("dgx", **labels) | {"status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    pools = {p["metadata"]["name"]: p["spec"] for p in discover_pools([mig_node])}
    assert sorted(pools) == ["h100-80-p5-48xlarge", "h100-80-p5-48xlarge-mig-1g-10gb",
                             "h100-80-p5-48xlarge-mig-3g-40gb"]
    whole, small = pools["h100-80-p5-48xlarge"], pools["h100-80-p5-48xlarge-mig-1g-10gb"]
    assert whole["gpu"]["perNode"] == 4  # the unpartitioned GPUs, not GFD's count of all eight
    # GFD's 14 slices: two GPUs of seven
    assert small["gpu"] == {"product": "NVIDIA-H100-80GB-HBM3", "perNode": 2, "memoryMiB": 9856,
                            "mig": {"profile": "1g.10gb", "perGPU": 7}}
    assert pools["h100-80-p5-48xlarge-mig-3g-40gb"]["gpu"]["perNode"] == 2  # 4 slices, two a GPU
    assert small["pricePerNodeHour"] == round(6.88 / 7 * 14, 3)  # each slice its 1/7 of the GPU
    assert small["nodeSelector"]["nvidia.com/mig.strategy"] == "mixed"
    for name, spec in pools.items():
        GPUNodePool.model_validate({"metadata": {"name": name}, "spec": spec})


def test_a_node_with_more_than_16_slices_of_a_profile_gives_a_pool_the_schema_takes() -> None:
    """Eight H100s all in 1g.10gb: GFD counts 56 slices; the pool says 8 GPUs of 7 (perNode is at most 16)."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "node.kubernetes.io/instance-type": "p5.48xlarge",
              "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "56",
              "nvidia.com/mig-2g.20gb.count": "9"}
    pools = {p["metadata"]["name"]: p["spec"] for p in discover_pools([node("dgx", **labels)])}
    small = pools["h100-80-p5-48xlarge-mig-1g-10gb"]["gpu"]
    assert (small["perNode"], small["mig"]["perGPU"]) == (8, 7)
    two = pools["h100-80-p5-48xlarge-mig-2g-20gb"]["gpu"]
    assert (two["perNode"], two["mig"]["perGPU"]) == (3, 3)  # 9 slices of at most 3 a GPU
    for name, spec in pools.items():
        GPUNodePool.model_validate({"metadata": {"name": name}, "spec": spec})
        mig = spec["gpu"].get("mig")
        assert mig is None or not mig_problems(mig["profile"], mig["perGPU"], None)  # the CRD's CEL rules

"""`memfit pools discover`: GFD node labels -> GPUNodePools with catalog defaults."""

from __future__ import annotations

from typing import Any

from memfit.api.pool import GPUNodePool
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

"""Kueue quota for GPUs by memory (issue #33 item 3): MIG slice pools and DRA pools in `memfit kueue flavors`,
and the quota memfit reads back for them (memfit.lifecycle.quota)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from memfit.api.pool import GPUNodePool
from memfit.cli import main
from memfit.kube.kueue import KueueConfigError, build_kueue_setup, device_class_mappings, quota_resource
from memfit.lifecycle.quota import parse_cluster_queue

H100_NODES = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


def pool(name: str, *, mig: dict[str, Any] | None = None, dra: dict[str, Any] | None = None,
         selector: dict[str, str] | None = None, per_node: int = 1, max_nodes: int = 2) -> GPUNodePool:
    gpu: dict[str, Any] = {"product": "NVIDIA-H100-80GB-HBM3", "perNode": per_node}
    if mig is not None:
        gpu["mig"] = mig
    if dra is not None:
        gpu["dra"] = dra
    return GPUNodePool.model_validate({"metadata": {"name": name}, "spec": {
        "gpu": gpu, "nodeSelector": selector or H100_NODES, "maxNodes": max_nodes, "pricePerNodeHour": 6.88}})


WHOLE = pool("h100")
SLICES_1G = pool("h100-1g", mig={"profile": "1g.10gb", "perGPU": 7})
SLICES_3G = pool("h100-3g", mig={"profile": "3g.40gb", "perGPU": 2})


def _flavor_quota(cq: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (group,) = cq["spec"]["resourceGroups"]
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}


def test_mig_pools_over_the_whole_gpu_pool_s_nodes_each_hold_quota_in_their_own_slices() -> None:
    docs = build_kueue_setup([SLICES_3G, WHOLE, SLICES_1G], gpu_quota={"h100-1g": 5})
    cq = docs[3]
    (group,) = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb",
                                         "nvidia.com/mig-3g.40gb"]
    quota = _flavor_quota(cq)
    # every flavor lists every covered resource (Kueue's rule), with quota only in its pool's own
    assert quota["h100"] == {"cpu": "1000", "memory": "64Ti", "nvidia.com/gpu": 2,
                             "nvidia.com/mig-1g.10gb": 0, "nvidia.com/mig-3g.40gb": 0}
    assert quota["h100-1g"]["nvidia.com/mig-1g.10gb"] == 5 and quota["h100-1g"]["nvidia.com/gpu"] == 0
    assert quota["h100-3g"]["nvidia.com/mig-3g.40gb"] == 2 * 1 * 2  # maxNodes x perNode x perGPU
    # the same nodes, the same labels: allowed, the resource tells the flavors apart
    assert {d["metadata"]["name"]: d["spec"]["nodeLabels"] for d in docs[:3]} == {
        "h100": H100_NODES, "h100-1g": H100_NODES, "h100-3g": H100_NODES}


def test_two_pools_of_one_resource_with_contained_selectors_are_still_refused() -> None:
    other = pool("h100-1g-spot", mig={"profile": "1g.10gb", "perGPU": 7},
                 selector={**H100_NODES, "karpenter.sh/capacity-type": "spot"})
    with pytest.raises(KueueConfigError, match=r"GPUNodePool h100-1g: spec.nodeSelector .* is contained in "
                       r"h100-1g-spot's .* the others requesting nvidia.com/mig-1g.10gb do not match"):
        build_kueue_setup([SLICES_1G, other])


def test_dra_pools_map_their_device_class_to_the_device_plugin_s_resource() -> None:
    whole = pool("h100-dra", dra={"deviceClassName": "gpu.nvidia.com"}, selector={"pool": "dra"})
    slices = pool("h100-dra-1g", dra={"deviceClassName": "mig-1g.nvidia.com"}, selector={"pool": "dra"},
                  mig={"profile": "1g.10gb", "perGPU": 7})
    assert (quota_resource(whole), quota_resource(slices)) == ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb")
    assert device_class_mappings([slices, whole, WHOLE]) == [
        {"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]},
        {"name": "nvidia.com/mig-1g.10gb", "deviceClassNames": ["mig-1g.nvidia.com"]},
    ]


def test_two_mig_profiles_of_one_device_class_are_refused_naming_the_field() -> None:
    one = pool("dra-1g", dra={"deviceClassName": "mig.nvidia.com"}, mig={"profile": "1g.10gb", "perGPU": 7})
    three = pool("dra-3g", dra={"deviceClassName": "mig.nvidia.com"}, mig={"profile": "3g.40gb", "perGPU": 2})
    with pytest.raises(KueueConfigError, match=r"GPUNodePool dra-3g: spec.gpu.dra.deviceClassName 'mig.nvidia.com' "
                       r"is also the class of GPUNodePool dra-1g, whose quota resource is nvidia.com/mig-1g.10gb"):
        build_kueue_setup([one, three])


def test_cli_writes_the_kueue_configuration_fragment_for_dra_pools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pools.yaml"
    dra = pool("h100-dra", dra={"deviceClassName": "gpu.nvidia.com"}, selector={"pool": "dra"})
    path.write_text(yaml.safe_dump_all([{"apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool",
                                         **p.model_dump(mode="json", by_alias=True, exclude_none=True)} for p in (dra, SLICES_1G)]))
    assert main(["kueue", "flavors", str(path)]) == 0
    out = capsys.readouterr().out
    comment = "\n".join(line[3:] for line in out.splitlines() if line.startswith("#   "))
    assert yaml.safe_load(comment) == {"resources": {"deviceClassMappings": [
        {"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}]}}
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ResourceFlavor", "ResourceFlavor", "ClusterQueue", "LocalQueue"]


def test_quota_is_read_in_each_pool_s_resource() -> None:
    docs = build_kueue_setup([WHOLE, SLICES_1G, SLICES_3G], cluster_queue="cq",
                             gpu_quota={"h100": 1, "h100-1g": 7, "h100-3g": 0})
    cq = dict(docs[3], status={"flavorsReservation": [
        {"name": "h100-1g", "resources": [{"name": "nvidia.com/gpu", "total": "0"},
                                          {"name": "nvidia.com/mig-1g.10gb", "total": "6"}]},
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "1"}]}]})
    resources = {p.metadata.name: quota_resource(p) for p in (WHOLE, SLICES_1G, SLICES_3G)}
    quota = parse_cluster_queue(cq, (), resources)
    assert (quota.free("h100"), quota.free("h100-1g"), quota.free("h100-3g")) == (0, 1, 0)
    assert quota.describe() == "ClusterQueue cq GPU quota free/nominal: h100 0/1, h100-1g 1/7, h100-3g 0/0"
    # read as whole GPUs (what memfit did before), the slice flavors would have no quota at all
    assert parse_cluster_queue(cq).free("h100-1g") == 0


def test_the_memory_fit_admission_check_reads_a_slice_request_against_the_slice() -> None:
    """A Job memfit did not launch asks for a 1g.10gb slice; Kueue assigned the slice flavor: the check
    weighs the declared job against the slice's memory, not the whole GPU's, and names the slice where it fits."""
    from memfit.catalog import CATALOG
    from memfit.lifecycle.admission.memory_fit import GpuRequest, check_memory_fit, gpu_request, parse_problem

    workload = {
        "spec": {"podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"cpu": "4", "nvidia.com/mig-1g.10gb": "1"}}}]}}}]},
        "status": {"admission": {"podSetAssignments": [
            {"name": "main", "count": 1, "flavors": {"cpu": "h100-1g", "nvidia.com/mig-1g.10gb": "h100-1g"}}]}},
    }
    request = gpu_request(workload)
    assert request == GpuRequest("h100-1g", 1, 1)
    llama_1b = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000}
    job = parse_problem(yaml.safe_dump({
        "apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob", "metadata": {"name": "x"},
        "spec": {"problem": {"huggingface": {"model": "org/m", "config": llama_1b, "sequenceLength": 1024}},
                 "training": {"globalBatchSize": 8}}}), "cm/job.yaml")
    assert not isinstance(job, str), job
    verdict = check_memory_fit(job, request, pool=SLICES_1G, queue_pools=[SLICES_1G, SLICES_3G, WHOLE], catalog=CATALOG)
    assert verdict.state == "Rejected", verdict
    assert "flavor h100-1g (NVIDIA-H100-80GB-HBM3-MIG-1g.10gb) has 10.0 GiB; fits on flavor h100-3g" in verdict.message

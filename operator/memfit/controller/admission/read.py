"""Read one Workload's snapshot for the memory-fit check: its owner Job, the problem ConfigMap that Job
names, the assigned GPU flavor's node labels and the pools of its ClusterQueue's flavors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.controller.kubeapi import KubeApi
from memfit.lifecycle.admission import WorkloadSnapshot, problem_config_map
from memfit.lifecycle.admission.memory_fit import PENDING, gpu_request, pool_of_flavor

Manifest = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def observe_pools(api: KubeApi) -> list[GPUNodePool]:
    pools: list[GPUNodePool] = []
    for raw in api.list_pools():
        try:
            pools.append(GPUNodePool.model_validate(raw | {"status": None}))
        except ValidationError:
            continue  # the pool handler reports invalid pools
    return pools


def pending_checks(workload: Manifest, names: set[str]) -> tuple[str, ...]:
    """memfit's checks on the Workload that wait for an answer, once Kueue reserved quota (a flavor)."""
    status = workload.get("status") or {}
    if not status.get("admission"):
        return ()
    return tuple(c["name"] for c in status.get("admissionChecks") or []
                 if c.get("name") in names and c.get("state") == PENDING)


def observe_workload(api: KubeApi, workload: Manifest, pending: tuple[str, ...],
                     pools: list[GPUNodePool]) -> WorkloadSnapshot:
    namespace = workload["metadata"]["namespace"]
    owner = next((r for r in workload["metadata"].get("ownerReferences") or [] if r.get("kind") == "Job"), None)
    job = api.get_job(namespace, owner["name"]) if owner is not None else None
    ref = problem_config_map(job)
    config_map = api.get_config_map(namespace, ref) if ref else None
    problem = dict(config_map.get("data") or {}) if config_map is not None else None
    # The flavor and the queue's pools matter only to a Job that names a problem memfit can read.
    request = gpu_request(workload) if problem is not None else None
    flavor = (api.get_resource_flavor(request.flavor) or {}) if request is not None else {}
    return WorkloadSnapshot(
        workload=workload,
        pending_checks=pending,
        owner=owner,
        job=job,
        problem=problem,
        flavor_labels=(flavor.get("spec") or {}).get("nodeLabels") or {},
        pools=pools,
        queue_pools=_queue_pools(api, workload, pools) if ref and problem is not None else [],
        catalog=CATALOG,
        now=now_rfc3339(),
    )


def _queue_pools(api: KubeApi, workload: Manifest, pools: list[GPUNodePool]) -> list[GPUNodePool]:
    """The pools of the flavors of the Workload's ClusterQueue (for where it would fit)."""
    queue = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
    cq = api.get_cluster_queue(str(queue)) if queue else None
    names = {str(f.get("name")) for g in ((cq or {}).get("spec") or {}).get("resourceGroups") or []
             for f in g.get("flavors") or []}
    out: list[GPUNodePool] = []
    for name in sorted(names):
        flavor = api.get_resource_flavor(name) or {}
        pool = pool_of_flavor(name, (flavor.get("spec") or {}).get("nodeLabels") or {}, pools)
        if pool is not None and pool not in out:
            out.append(pool)
    return out

"""The `memfit.dev/memory-fit` Kueue AdmissionCheck: does a Job memfit did not launch fit the GPUs
Kueue reserved for it? Pure: a Workload, its Job, the problem document and the pools in; a verdict out.

The contract (docs/kueue.md): the Job carries the annotation `memfit.dev/problem: <ConfigMap>`; the
ConfigMap (same namespace) holds under `job.yaml` a MemoryOptimizedTrainingJob manifest, the file
`memfit plan` and `memfit estimate --job` read. Its `spec.strategy` is the Job's declared strategy
(`auto` fields read as the usual setup, as `memfit estimate` does). The world size is what the
Workload asks for: pods x GPUs per pod of its pod sets; the GPUs per node are a pod's. The fit rule is
the planner's: predicted per-GPU peak x (1 + the job's headroom) <= the flavor's usable GPU memory.

Verdicts: `Ready` (fits, or nothing to check), `Rejected` (cannot fit as declared on the flavor, or the
problem document is invalid: the Job can never pass), `Retry` (the cluster may change: the ConfigMap
or the flavor's pool is missing). A message always says why; a rejection says where it would fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml
from pydantic import ValidationError

from memfit.api.common import PeftMethod, Precision
from memfit.api.job import MemoryOptimizedTrainingJob
from memfit.api.pool import GPUNodePool
from memfit.api.validation import violations_from
from memfit.catalog import GpuCatalog
from memfit.memory import Shape, predict_memory, strategy_from_pins, strategy_problem
from memfit.memory.strategy import Strategy
from memfit.mig import RESOURCE_PREFIX as MIG_RESOURCE_PREFIX
from memfit.planner import Offer, plan, resolve_shape
from memfit.planner.explain import gib
from memfit.planner.offers import resolve_offer
from memfit.planner.plan_job import job_adapter

CONTROLLER_NAME = "memfit.dev/memory-fit"
ANNOTATION_PROBLEM = "memfit.dev/problem"
PROBLEM_KEY = "job.yaml"
GPU_RESOURCE = "nvidia.com/gpu"
READY, RETRY, REJECTED, PENDING = "Ready", "Retry", "Rejected", "Pending"


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str  # Ready | Retry | Rejected
    message: str


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What the Workload asks for on one GPU flavor: pods x GPUs per pod."""

    flavor: str
    pods: int
    gpus_per_pod: int

    @property
    def world_size(self) -> int:
        return self.pods * self.gpus_per_pod


def _devices(container: Mapping[str, Any]) -> tuple[str, int]:
    """The GPU resource a container asks for and how many: whole GPUs, or the slices of one MIG profile
    (`nvidia.com/mig-<profile>`, docs/mig.md); ("", 0) for none."""
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        for name, value in sorted((resources.get(part) or {}).items()):
            if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
                text = str(value).strip()
                if text.isdigit() and int(text) > 0:
                    return name, int(text)
    return "", 0


def gpu_request(workload: Mapping[str, Any]) -> GpuRequest | None:
    """The GPU pod set of an admitted-or-reserving Workload and its assigned flavor (the flavor of the
    GPU resource its pods request: whole GPUs or MIG slices); None when no pod set asks for GPUs (or
    Kueue has not assigned flavors yet)."""
    assignments = {a.get("name"): a for a in ((workload.get("status") or {}).get("admission") or {})
                   .get("podSetAssignments") or []}
    best: GpuRequest | None = None
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        pod_spec = ((pod_set.get("template") or {}).get("spec") or {})
        asked = [_devices(c) for c in pod_spec.get("containers") or []]
        resource = next((r for r, n in asked if n), "")
        per_pod = sum(n for r, n in asked if r == resource)
        flavor = ((assignments.get(pod_set.get("name")) or {}).get("flavors") or {}).get(resource)
        count = int((assignments.get(pod_set.get("name")) or {}).get("count") or pod_set.get("count") or 1)
        if per_pod > 0 and flavor and (best is None or per_pod * count > best.world_size):
            best = GpuRequest(str(flavor), count, per_pod)
    return best


def parse_problem(text: str, source: str) -> MemoryOptimizedTrainingJob | str:
    """The MemoryOptimizedTrainingJob in a ConfigMap value, or every problem with its field path."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        return f"{source}: not YAML ({str(error).splitlines()[0]})"
    doc = next((d for d in docs if isinstance(d, dict) and d.get("kind") == "MemoryOptimizedTrainingJob"), None)
    if doc is None:
        return f"{source}: no MemoryOptimizedTrainingJob document (the manifest `memfit plan` reads)"
    try:
        return MemoryOptimizedTrainingJob.model_validate(doc)
    except ValidationError as error:
        return "; ".join(str(v) for v in violations_from(error, source))


def pool_of_flavor(flavor: str, node_labels: Mapping[str, str], pools: Sequence[GPUNodePool]) -> GPUNodePool | None:
    """The pool a flavor stands for: the pool of the same name (`memfit kueue flavors`), else the pool
    whose nodeSelector equals the flavor's nodeLabels."""
    for pool in pools:
        if pool.metadata.name == flavor:
            return pool
    for pool in pools:
        if pool.spec.node_selector and dict(pool.spec.node_selector) == dict(node_labels):
            return pool
    return None


def declared_strategy(job: MemoryOptimizedTrainingJob, request: GpuRequest, *, bf16: bool = True) -> Strategy:
    """The job's pinned strategy on the requested GPUs (`auto` = the usual setup; precision `auto` is
    bf16, or fp16 on a GPU without bf16, as a practitioner would run it)."""
    pins = job.spec.strategy
    if pins.precision == Precision.AUTO and not bf16:
        pins = pins.model_copy(update={"precision": Precision.FP16})
    strategy = strategy_from_pins(
        pins, optimizer=job.spec.training.optimizer, world_size=request.world_size,
        gpus_per_node=request.gpus_per_pod, global_batch_size=job.spec.training.global_batch_size,
    )
    adapter = job_adapter(job.spec) if strategy.config.peft != PeftMethod.NONE else None
    return replace(strategy, adapter=adapter) if adapter is not None else strategy


def _need(job: MemoryOptimizedTrainingJob, shape: Shape, strategy: Strategy) -> float:
    """Predicted per-GPU peak with the job's headroom: what the GPU must have."""
    return predict_memory(shape, strategy).peak_bytes * (1 + job.spec.objective.memory_headroom_percent / 100)


def _usable(pool: GPUNodePool, catalog: GpuCatalog) -> Offer | str:
    offer = resolve_offer(pool, catalog=catalog)
    return offer if isinstance(offer, Offer) else offer.reason


def check_memory_fit(job: MemoryOptimizedTrainingJob, request: GpuRequest, *, pool: GPUNodePool | None,
                     queue_pools: Sequence[GPUNodePool], catalog: GpuCatalog) -> Verdict:
    """The verdict for `job` (its declared strategy) on `request`'s GPUs of the flavor's `pool`;
    `queue_pools` are the pools of the ClusterQueue's flavors, for the suggestion."""
    if pool is None:
        return Verdict(RETRY, f"flavor {request.flavor} is no GPUNodePool (by name, or nodeLabels equal to a "
                              "pool's nodeSelector): its GPU memory is unknown")
    model = resolve_shape(job.spec, None)
    if isinstance(model, str):
        return Verdict(REJECTED, f"{ANNOTATION_PROBLEM}: spec.problem: {model}")
    offer = _usable(pool, catalog)
    if isinstance(offer, str):
        return Verdict(RETRY, f"flavor {request.flavor} (pool {pool.metadata.name}): {offer}")
    strategy = declared_strategy(job, request, bf16=offer.supports_bf16)
    problem = strategy_problem(strategy)
    if problem is not None:
        return Verdict(REJECTED, f"{ANNOTATION_PROBLEM}: spec.strategy: {problem}")
    shape = Shape.of(model)
    need = _need(job, shape, strategy)
    # "percent", not "%": Kueue (0.19.1) passes a rejected check's message to its event as a format string,
    # so a "%" there reads "%!h(MISSING)" in `kubectl describe workload`.
    what = (f"{strategy.config.describe()} on {request.world_size} GPU(s), {request.gpus_per_pod} per pod, "
            f"incl. {job.spec.objective.memory_headroom_percent} percent headroom")
    if need <= offer.usable_bytes:
        return Verdict(READY, f"fits: needs {gib(need)} per GPU ({what}); flavor {request.flavor} "
                              f"({offer.product}) has {gib(offer.usable_bytes)}")
    others = [p for p in queue_pools if p.metadata.name != pool.metadata.name]
    where = _where_it_fits(job, request, shape, others, catalog)
    return Verdict(REJECTED, f"needs {gib(need)} per GPU ({what}); flavor {request.flavor} ({offer.product}) has "
                             f"{gib(offer.usable_bytes)}; {where}")


def _where_it_fits(job: MemoryOptimizedTrainingJob, request: GpuRequest, shape: Shape,
                   pools: Sequence[GPUNodePool], catalog: GpuCatalog) -> str:
    """The cheapest other flavor (per GPU hour) that holds the declared strategy on the same GPUs;
    else memfit's own plan over those pools; else that none of them can hold it."""
    fitting: list[tuple[float, str, Offer]] = []
    for pool in pools:
        offer = _usable(pool, catalog)
        if isinstance(offer, Offer) and request.gpus_per_pod <= offer.gpus_per_node:
            strategy = declared_strategy(job, request, bf16=offer.supports_bf16)
            if strategy_problem(strategy) is None and _need(job, shape, strategy) <= offer.usable_bytes:
                fitting.append((offer.price_per_node_hour / offer.gpus_per_node, pool.metadata.name, offer))
    if fitting:
        _, name, offer = min(fitting)
        return f"fits on flavor {name} ({offer.product}, {gib(offer.usable_bytes)}) as declared"
    if not pools:
        return "the ClusterQueue has no other flavor memfit knows"
    result = plan(job.spec, pools=pools, catalog=catalog, max_alternatives=0)
    if result.plan is None:
        return "no other flavor of the ClusterQueue can hold it, even with memfit's strategies"
    p = result.plan
    return (f"fits on flavor {p.node_pool} with {p.nodes * p.gpus_per_node} GPU(s) as {p.describe()} "
            f"(predicted {gib(p.memory.peak_bytes)}; memfit's plan)")

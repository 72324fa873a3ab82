"""Auto-downsizing end to end on the local cluster: submit one problem several times and record where
each run lands (the integration test and `benchmarks/downsizing.py` share it).

Two KWOK pools of one simulated GPU product (`Sim-GPU`: like two memory partitions of one GPU model,
a cheap small one and a dear large one). Trainer pods really train on CPU through the pod runner; their
tensor bytes are the CPU allocator's, and the GPU's own terms (the caching allocator's reservation and
the CUDA context) are simulated from the node annotation (`memfit_testbed.kwok_pools`), since no GPU
exists here:

- `down`: the simulated GPU has a smaller allocator gap (1.02) and context (300 MiB) than memfit's
  defaults (1.10, 544 MiB). The first run is planned on the defaults and lands on the large pool; its
  measured peaks teach `Sim-GPU`'s device terms and the next run fits the small pool.
- `up`: a larger gap (1.15) and context (600 MiB), still inside the small GPU: the first run fits the
  small pool by the prediction and succeeds with less headroom than asked; with every strategy field
  pinned the next run moves to the large pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kubernetes import client

from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.kwok_pools import Gpu, Pool, delete_pool, scale_pool, wait_nodes_ready
from memfit_testbed.operator_helpers import GROUP, VERSION, create_job, wait_phase

MIB = 2**20
STEPS = 4
PRODUCT = "Sim-GPU"
PROBLEM = {"builtin": {"kind": "gpt", "layers": 4, "hidden": 512, "heads": 8, "vocab": 8192, "sequenceLength": 256}}
PINNED = {"engine": "ddp", "precision": "bf16", "activationCheckpointing": "none", "optimizer8bit": "disabled",
          "optimizerInBackward": "disabled", "chunkedLoss": "disabled", "microBatchSize": 8}


@dataclass(frozen=True)
class Scenario:
    name: str
    simulated_gpu: dict[str, float]  # fragmentation, contextMiB
    small_mib: int
    large_mib: int
    small_price: float = 0.30
    large_price: float = 0.90
    pinned: bool = False

    def pools(self) -> list[tuple[str, int, float]]:
        return [(f"{self.name}-small", self.small_mib, self.small_price),
                (f"{self.name}-large", self.large_mib, self.large_price)]

    def product(self) -> str:
        return f"{PRODUCT}-{self.name}"


DOWN = Scenario("down", {"fragmentation": 1.02, "contextMiB": 300}, small_mib=800, large_mib=4096)
UP = Scenario("up", {"fragmentation": 1.15, "contextMiB": 600}, small_mib=1400, large_mib=4096, pinned=True)


@dataclass(frozen=True)
class RunRecord:
    """One submission: where it ran and what was predicted and measured."""

    run: int
    job: str
    phase: str
    pool: str
    price_per_hour: float
    configuration: str
    usable_mib: float
    predicted_peak_mib: float
    measured_allocated_mib: float | None
    measured_reserved_mib: float | None
    measured_device_mib: float | None
    predicted_step_seconds: float
    measured_step_seconds: float | None
    estimated_cost: float


def install(kube: Kube, scenario: Scenario) -> None:
    """The scenario's GPUNodePools and one KWOK node each (simulated GPU annotated)."""
    custom = client.CustomObjectsApi(kube.api_client)
    nodes: list[str] = []
    for name, mib, price in scenario.pools():
        pool = Pool(name=name, nodes=1, instance_type=f"sim.{name}", capacity_type="on-demand", cpu="16",
                    memory="64Gi", gpu=Gpu(product=scenario.product(), memory_mib=mib, count=1),
                    simulated_gpu=scenario.simulated_gpu)
        nodes += scale_pool(kube.core, pool, 1, wait=0)
        doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPUNodePool", "metadata": {"name": name},
               "spec": {"gpu": {"product": scenario.product(), "perNode": 1, "memoryMiB": mib, "bf16TFLOPS": 100},
                        "nodeSelector": {"memfit.dev/pool": name}, "pricePerNodeHour": price, "maxNodes": 1,
                        "capacityType": "on-demand"}}
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", doc)
        except client.exceptions.ApiException as error:
            if error.status != 409:
                raise
    wait_nodes_ready(kube.core, nodes, 60)


def uninstall(kube: Kube, scenario: Scenario) -> None:
    """Remove what `install` added: the scenario's pools are cluster-wide and cheaper than the test
    bed's own, so left behind they would draw every later job of a shared cluster."""
    custom = client.CustomObjectsApi(kube.api_client)
    for name, _, _ in scenario.pools():
        delete_pool(kube.core, name)
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, "gpunodepools", name)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise


def job_doc(scenario: Scenario, run: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "problem": PROBLEM,
        "training": {"globalBatchSize": 8, "maxSteps": STEPS, "optimizer": "adamw", "learningRate": 0.001},
        "placement": {"nodePools": [name for name, _, _ in scenario.pools()], "maxNodes": 1},
        "objective": {"minimize": "cost", "memoryHeadroomPercent": 10},
        "profiling": {"timeoutSeconds": 300},
        "recovery": {"maxReplans": 1, "capacityTimeoutSeconds": 120},
    }
    if scenario.pinned:
        spec["strategy"] = PINNED
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MemoryOptimizedTrainingJob",
            "metadata": {"name": f"{scenario.name}-run-{run}"}, "spec": spec}


def record(kube: Kube, namespace: str, run: int, job: dict[str, Any]) -> RunRecord:
    status = job["status"]
    plan = status.get("plan") or {}
    name = job["metadata"]["name"]
    pods = kube.pods(namespace, f"memfit.dev/job={name},memfit.dev/component=trainer")
    message: dict[str, Any] = {}
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            text = ((cs.get("state") or {}).get("terminated") or {}).get("message") or ""
            if text.startswith("{"):
                message = json.loads(text)

    def mib(key: str) -> float | None:
        value = message.get(key)
        return round(value / MIB, 1) if isinstance(value, int | float) else None

    return RunRecord(
        run=run, job=name, phase=status.get("phase", ""), pool=plan.get("nodePool", ""),
        price_per_hour=plan.get("costPerHour", 0.0),
        configuration=f"{plan.get('engine')} {plan.get('precision')} ckpt-{plan.get('activationCheckpointing')} "
                      f"8bit-{plan.get('optimizer8bit')} mbs {plan.get('microBatchSize')}x{plan.get('gradientAccumulationSteps')}",
        usable_mib=round(plan.get("gpuMemoryBytes", 0) / MIB, 1),
        predicted_peak_mib=round(plan.get("predictedPeakBytes", 0) / MIB, 1),
        measured_allocated_mib=mib("peakBytes"), measured_reserved_mib=mib("reservedPeakBytes"),
        measured_device_mib=mib("devicePeakBytes"),
        predicted_step_seconds=float(plan.get("estimatedHours", 0.0)) * 3600 / STEPS,
        measured_step_seconds=message.get("stepSeconds"),
        estimated_cost=plan.get("estimatedCost", 0.0),
    )


def submit_runs(kube: Kube, namespace: str, scenario: Scenario, *, runs: int, timeout: float,
                seed: Callable[[dict[str, Any]], object] | None = None) -> list[RunRecord]:
    """Submit the scenario's job `runs` times, one after another; each must finish before the next.
    `seed(doc)` may put a profile in the cache first (skips profiling; learning is the same)."""
    out = []
    for run in range(runs):
        doc = job_doc(scenario, run)
        if seed is not None:
            seed(doc)
        create_job(kube, namespace, doc)
        job = wait_phase(kube, namespace, doc["metadata"]["name"], ("Succeeded", "Failed"), timeout)
        out.append(record(kube, namespace, run, job))
    return out


def as_dicts(records: list[RunRecord]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]

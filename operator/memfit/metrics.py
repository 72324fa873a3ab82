"""Operator metrics (prefix `memfit_`, base units, bounded labels), served on /metrics with /healthz."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from memfit import __version__

PHASES = ("Pending", "Profiling", "Planning", "Launching", "Running", "Replanning", "Succeeded", "Failed")

# The attempt outcomes that start a new attempt (api.job.AttemptOutcome.replans).
REPLAN_REASONS = ("OutOfMemory", "MemoryOverPlan", "NoCapacity", "RankFailed", "RankDisrupted")
REPLANS = Counter(
    "memfit_replans",
    "Attempts ended for a new one, by reason (OutOfMemory, MemoryOverPlan, NoCapacity, RankFailed: a "
    "multi-node gang restarted after a rank failed, RankDisrupted: re-planned after a rank's node was lost).",
    ["namespace", "reason"],
)
PROFILING_FAILURES = Counter("memfit_profiling_failures", "Jobs whose profiling failed.", ["namespace"])
RECONCILE_ERRORS = Counter("memfit_reconcile_errors", "Reconciles that raised, by resource kind.", ["kind"])
for _kind in ("MemoryOptimizedTrainingJob", "GPUNodePool", "Resync", "AdmissionCheck"):
    RECONCILE_ERRORS.labels(_kind)
ADMISSION_CHECKS = Counter(
    "memfit_admission_checks",
    "Workloads the memfit.dev/memory-fit AdmissionCheck answered, by state (Ready, Retry, Rejected).",
    ["state"],
)
PROFILE_SECONDS = Histogram(
    "memfit_profile_duration_seconds",
    "Profiling Job wall time.",
    buckets=(10, 30, 60, 120, 300, 600, 1200, 3600),
)
PLAN_SECONDS = Histogram(
    "memfit_plan_duration_seconds",
    "Planner wall time per decision.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """The metric-relevant part of one MOTJ's status."""

    namespace: str
    name: str
    phase: str
    pool: str = ""
    predicted_peak_bytes: float | None = None
    measured_peak_bytes: float | None = None
    gpu_memory_bytes: float | None = None
    price_per_hour: float | None = None
    baseline_price_per_hour: float | None = None
    savings_percent: float | None = None
    spend_dollars: float | None = None
    predicted_cost_dollars: float | None = None
    engine: str = ""
    precision: str = ""
    zero_stage: str = ""
    checkpointing: str = ""
    offload: str = ""
    optimizer8bit: str = ""
    progress: tuple[tuple[str, float], ...] = ()  # status.progress numbers: (field, value)

    @classmethod
    def from_status(cls, namespace: str, name: str, status: dict[str, Any]) -> JobSnapshot:
        plan = status.get("plan") or {}
        return cls(
            namespace=namespace,
            name=name,
            phase=str(status.get("phase") or "Pending"),
            pool=str(plan.get("nodePool") or ""),
            predicted_peak_bytes=plan.get("predictedPeakBytes"),
            measured_peak_bytes=status.get("measuredPeakBytes"),
            gpu_memory_bytes=plan.get("gpuMemoryBytes"),
            price_per_hour=plan.get("costPerHour"),
            baseline_price_per_hour=plan.get("baselineCostPerHour"),
            savings_percent=plan.get("savingsPercent"),
            spend_dollars=(status.get("spend") or {}).get("total"),
            predicted_cost_dollars=plan.get("estimatedCost"),
            engine=str(plan.get("engine") or ""),
            precision=str(plan.get("precision") or ""),
            zero_stage=str(plan.get("zeroStage", "")),
            checkpointing=str(plan.get("activationCheckpointing") or ""),
            offload=str(plan.get("offload") or ""),
            optimizer8bit=str(plan.get("optimizer8bit", "")).lower(),
            progress=_progress_values(status.get("progress") or {}),
        )


# status.progress (read by the operator from rank 0 about every 15 s) as gauges: one series per job.
PROGRESS_GAUGES = {
    "step": ("memfit_job_progress_step", "Last completed optimizer step (status.progress.step)."),
    "maxSteps": ("memfit_job_max_steps", "training.maxSteps of the job."),
    "loss": ("memfit_job_loss", "Training loss of the last step (status.progress.loss)."),
    "evalLoss": ("memfit_job_eval_loss", "Last evaluation loss, when the trainer reports one."),
    "tokensPerSecond": ("memfit_job_tokens_per_second", "Tokens per second of the whole job."),
    "etaSeconds": ("memfit_job_eta_seconds", "Seconds to maxSteps at the mean step time."),
}


def _progress_values(progress: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    return tuple(
        (name, float(progress[name]))
        for name in PROGRESS_GAUGES
        if isinstance(progress.get(name), int | float) and not isinstance(progress.get(name), bool)
    )


class JobCollector(Collector):
    """Per-job gauges computed from the latest statuses; a deleted job's series disappear with it."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], JobSnapshot] = {}
        self._lock = threading.Lock()

    def observe(self, snapshot: JobSnapshot) -> None:
        with self._lock:
            new_namespace = all(ns != snapshot.namespace for ns, _ in self._jobs)
            self._jobs[(snapshot.namespace, snapshot.name)] = snapshot
        if new_namespace:
            # Export 0 for the known series (Prometheus practice), so rates and alerts see them from the start.
            for reason in REPLAN_REASONS:
                REPLANS.labels(snapshot.namespace, reason)
            PROFILING_FAILURES.labels(snapshot.namespace)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._jobs.pop((namespace, name), None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            jobs = list(self._jobs.values())
        by_phase = GaugeMetricFamily(
            "memfit_jobs", "MemoryOptimizedTrainingJobs by phase.", labels=["namespace", "phase"]
        )
        for namespace in sorted({j.namespace for j in jobs}):
            for phase in PHASES:
                by_phase.add_metric(
                    [namespace, phase], sum(1 for j in jobs if j.namespace == namespace and j.phase == phase)
                )
        yield by_phase
        per_pool = {
            "predicted_peak_bytes": ("memfit_job_predicted_peak_bytes", "Predicted per-GPU peak memory."),
            "measured_peak_bytes": ("memfit_job_measured_peak_bytes", "Measured per-GPU peak memory."),
            "gpu_memory_bytes": ("memfit_job_gpu_memory_bytes", "Usable memory of one GPU of the pool."),
            "price_per_hour": ("memfit_job_price_dollars_per_hour", "Price of the planned nodes per hour."),
        }
        for attr, (metric, help_text) in per_pool.items():
            family = GaugeMetricFamily(metric, help_text, labels=["namespace", "job", "pool"])
            for j in jobs:
                value = getattr(j, attr)
                if value is not None and j.pool:
                    family.add_metric([j.namespace, j.name, j.pool], float(value))
            yield family
        baseline = GaugeMetricFamily(
            "memfit_job_baseline_price_dollars_per_hour",
            "Price per hour of the job's baseline pool.",
            labels=["namespace", "job"],
        )
        savings = GaugeMetricFamily(
            "memfit_job_savings_ratio",
            "1 - plan total cost / baseline total cost (a practitioner without a planner: the 20 B/param rule, "
            "escalating from plain DDP to FSDP with offload until it fits); positive = saved.",
            labels=["namespace", "job"]
        )
        spend = CounterMetricFamily(
            "memfit_job_spend_dollars",
            "Actual spend: GPU-hours x price of every finished profiling run and attempt, failed ones included.",
            labels=["namespace", "job"],
        )
        predicted = GaugeMetricFamily(
            "memfit_job_predicted_cost_dollars", "Total cost the current plan was estimated at.",
            labels=["namespace", "job"],
        )
        for j in jobs:
            if j.spend_dollars is not None:
                spend.add_metric([j.namespace, j.name], float(j.spend_dollars))
            if j.predicted_cost_dollars is not None:
                predicted.add_metric([j.namespace, j.name], float(j.predicted_cost_dollars))
        yield spend
        yield predicted
        info = GaugeMetricFamily(
            "memfit_job_info",
            "The planned configuration of a job.",
            labels=[
                "namespace",
                "job",
                "pool",
                "engine",
                "precision",
                "zero_stage",
                "checkpointing",
                "offload",
                "optimizer8bit",
            ],
        )
        for j in jobs:
            if j.baseline_price_per_hour:
                baseline.add_metric([j.namespace, j.name], float(j.baseline_price_per_hour))
            if j.savings_percent is not None:
                savings.add_metric([j.namespace, j.name], float(j.savings_percent) / 100)
            if j.pool:
                info.add_metric(
                    [
                        j.namespace,
                        j.name,
                        j.pool,
                        j.engine,
                        j.precision,
                        j.zero_stage,
                        j.checkpointing,
                        j.offload,
                        j.optimizer8bit,
                    ],
                    1,
                )
        yield baseline
        yield savings
        yield info
        for field_name, (metric, help_text) in PROGRESS_GAUGES.items():
            family = GaugeMetricFamily(metric, help_text, labels=["namespace", "job"])
            for j in jobs:
                value = dict(j.progress).get(field_name)
                if value is not None:
                    family.add_metric([j.namespace, j.name], value)
            yield family
        build = GaugeMetricFamily("memfit_build_info", "memfit version.", labels=["version"])
        build.add_metric([__version__], 1)
        yield build


JOBS = JobCollector()
REGISTRY.register(JOBS)


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry = REGISTRY
    healthy: threading.Event

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            body, ctype, code = generate_latest(self.registry), CONTENT_TYPE_LATEST, 200
        elif self.path.startswith("/healthz"):
            ok = self.healthy.is_set()
            body, ctype, code = (b"ok\n" if ok else b"starting\n"), "text/plain", 200 if ok else 503
        else:
            body, ctype, code = b"not found\n", "text/plain", 404
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def serve(host: str, port: int, healthy: threading.Event) -> ThreadingHTTPServer:
    """Start the /metrics and /healthz server in a daemon thread."""
    handler = type("Handler", (_Handler,), {"healthy": healthy})
    server = ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, name="memfit-metrics", daemon=True).start()
    return server

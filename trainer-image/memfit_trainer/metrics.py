"""Per-rank Prometheus exporter: memory, step time, throughput, loss and the applied plan.

Served on $MEMFIT_METRICS_PORT + local rank (several ranks share a pod's network namespace).
Labels are bounded: `job` (the MOTJ name) and `rank`; the plan info adds one series per attempt.
"""

from __future__ import annotations

import logging
import threading

from memfit.api import pod as contract
from memfit.api.plan import Plan
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

from memfit_trainer.meters import MemorySample

ENV_METRICS_PORT = contract.ENV_METRICS_PORT
ENV_JOB = contract.ENV_JOB
LABELS = ("job", "rank")
# Step time buckets from 10 ms to ~20 min (tiny CPU tests to large models on slow pools).
STEP_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 300, 600, 1200)

RETRY_SECONDS = 600.0  # how long a pod keeps trying to listen when its metrics port is taken
RETRY_INTERVAL_SECONDS = 2.0

log = logging.getLogger(__name__)


def plan_labels(plan: Plan) -> dict[str, str]:
    """The plan info labels: engine, stage, precision, checkpointing, offload, optimizer, micro-batch."""
    optimizer = plan.training.optimizer.value if plan.training is not None else "adamw"
    return {
        "engine": plan.engine.value,
        "stage": str(plan.zero_stage),
        "precision": plan.precision.value,
        "checkpointing": plan.activation_checkpointing.value,
        "offload": plan.offload.value,
        "optimizer": f"{optimizer}-8bit" if plan.optimizer8bit else optimizer,
        "micro_batch": str(plan.micro_batch_size),
        "accumulation": str(plan.gradient_accumulation_steps),
        "world_size": str(plan.world_size),
        "attempt": str(plan.attempt),
    }


class TrainerMetrics:
    """The trainer's metrics in their own registry (so tests and several runs per process stay apart)."""

    def __init__(self, *, job: str, rank: int) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"job": job, "rank": str(rank)}
        r = self.registry
        self.allocated = Gauge(
            "memfit_trainer_allocated_bytes",
            "Bytes allocated by tensors on this rank's device.",
            LABELS,
            registry=r,
        )
        self.reserved = Gauge(
            "memfit_trainer_reserved_bytes",
            "Bytes reserved by the allocator (CUDA caching allocator; process RSS on CPU).",
            LABELS,
            registry=r,
        )
        self.peak = Gauge(
            "memfit_trainer_peak_bytes", "Peak allocated bytes since the run started.", LABELS, registry=r
        )
        self.step_peak = Gauge(
            "memfit_trainer_step_peak_bytes", "Peak allocated bytes during the last step.", LABELS, registry=r
        )
        self.capacity = Gauge(
            "memfit_trainer_device_memory_bytes",
            "Total memory of the device (GPU memory; host RAM on CPU).",
            LABELS,
            registry=r,
        )
        self.step_seconds = Histogram(
            contract.METRIC_STEP_SECONDS,
            "Wall time of one optimizer step (all micro-batches).",
            LABELS,
            buckets=STEP_SECONDS_BUCKETS,
            registry=r,
        )
        self.samples = Counter(
            "memfit_trainer_samples", "Samples processed by this rank.", LABELS, registry=r
        )
        self.tokens_per_second = Gauge(
            contract.METRIC_TOKENS_PER_SECOND,
            "Tokens per second on this rank in the last step.",
            LABELS,
            registry=r,
        )
        self.loss = Gauge(
            contract.METRIC_LOSS, "Training loss of the last step (mean over ranks).", LABELS, registry=r
        )
        self.step = Gauge(contract.METRIC_STEP, "Last completed optimizer step.", LABELS, registry=r)
        # NaN until the trainer reports one: the operator leaves status.progress.evalLoss unset then.
        self.eval_loss = Gauge(
            contract.METRIC_EVAL_LOSS, "Loss on the evaluation split at its last evaluation.", LABELS, registry=r
        )
        self.resumed_from_step = Gauge(
            contract.METRIC_RESUMED_FROM_STEP,
            "Checkpoint step this pod resumed from (-1: started from scratch).",
            LABELS,
            registry=r,
        )
        self.plan = Info("memfit_trainer_plan", "The plan this rank applies (value 1).", LABELS, registry=r)
        for metric in (self.allocated, self.reserved, self.peak, self.step_peak, self.capacity,
                       self.tokens_per_second, self.loss, self.step):  # fmt: skip
            metric.labels(**self.labels).set(0)
        self.samples.labels(**self.labels)
        self.eval_loss.labels(**self.labels).set(float("nan"))
        self.resumed_from_step.labels(**self.labels).set(-1)

    def set_plan(self, plan: Plan, *, capacity_bytes: int) -> None:
        """Publish the plan info and the device capacity."""
        self.plan.labels(**self.labels).info(plan_labels(plan))
        self.capacity.labels(**self.labels).set(capacity_bytes)

    def set_resumed_from(self, step: int | None) -> None:
        """The checkpoint step this pod resumed from (None: it started at step 0); the step gauge starts there."""
        self.resumed_from_step.labels(**self.labels).set(-1 if step is None else step)
        if step is not None:
            self.step.labels(**self.labels).set(step)

    def observe_eval(self, *, loss: float) -> None:
        """Record an evaluation: the operator shows it as status.progress.evalLoss."""
        self.eval_loss.labels(**self.labels).set(loss)

    def observe_step(
        self,
        *,
        step: int,
        seconds: float,
        samples: int,
        tokens: int,
        loss: float,
        memory: MemorySample,
        run_peak_bytes: int,
    ) -> None:
        """Record one finished optimizer step."""
        labels = self.labels
        self.step.labels(**labels).set(step)
        self.step_seconds.labels(**labels).observe(seconds)
        self.samples.labels(**labels).inc(samples)
        self.tokens_per_second.labels(**labels).set(tokens / seconds if seconds > 0 else 0.0)
        self.loss.labels(**labels).set(loss)
        self.allocated.labels(**labels).set(memory.allocated_bytes)
        self.reserved.labels(**labels).set(memory.reserved_bytes)
        self.step_peak.labels(**labels).set(memory.peak_bytes)
        self.peak.labels(**labels).set(run_peak_bytes)

    def serve(self, port: int) -> bool:
        """Start the HTTP exporter on port; False (logged) if the port is taken."""
        try:
            self._server, self._thread = start_http_server(port, registry=self.registry)
        except OSError as exc:
            log.warning("metrics: cannot listen on port %d: %s (retrying in the background)", port, exc)
            # A port held a little longer (the process this pod replaces on a shared host network, the
            # local test bed's loopback) frees up: keep trying, so the operator can read the progress.
            self._stop_retry = threading.Event()
            threading.Thread(target=self._retry, args=(port,), name="metrics-retry", daemon=True).start()
            return False
        return True

    def _retry(self, port: int) -> None:
        for _ in range(int(RETRY_SECONDS / RETRY_INTERVAL_SECONDS)):
            if self._stop_retry.wait(RETRY_INTERVAL_SECONDS):
                return
            try:
                self._server, self._thread = start_http_server(port, registry=self.registry)
            except OSError:
                continue
            log.info("metrics: listening on port %d", port)
            return
        log.warning("metrics: gave up on port %d after %.0f s", port, RETRY_SECONDS)

    def close(self) -> None:
        """Stop the exporter (tests; a pod exits instead)."""
        stop = getattr(self, "_stop_retry", None)
        if stop is not None:
            stop.set()
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None

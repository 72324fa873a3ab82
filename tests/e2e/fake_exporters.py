#!/usr/bin/env python3
"""Stand-in exporters with memfit's exact metric names and realistic values, for the Prometheus tests.

    python fake_exporters.py operator|trainer-llama|trainer-tight|dcgm

Serves on 127.0.0.1 (a free port, printed as the first line of stdout) until SIGTERM. Two jobs: llama-ft
(ml-team-a, 2 ranks on l4-spot, healthy) and gpt-tight (ml-team-b, 2 ranks on t4-spot, under 5 % headroom,
under-predicted, re-planning on OOM every second, profiling failing every 2 s) so every dashboard panel
has data and every job alert has a job that triggers it. The real-process version is
test_real_operator_metrics.py.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

GIB = 2**30
PHASES = ("Pending", "Profiling", "Planning", "Launching", "Running", "Replanning", "Succeeded", "Failed")
JOB_LABELS = ["namespace", "job", "pool"]
PLAN = {"engine": "deepspeed", "precision": "bf16", "zero_stage": "2", "checkpointing": "selective",
        "offload": "none", "optimizer8bit": "true"}


@dataclass(frozen=True)
class FakeJob:
    namespace: str
    name: str
    pool: str
    predicted_bytes: float
    measured_bytes: float
    gpu_bytes: float
    price_per_hour: float
    baseline_per_hour: float
    rank_peaks_bytes: tuple[float, ...]
    step_seconds: float
    micro_batch: int
    sequence_length: int


LLAMA = FakeJob("ml-team-a", "llama-ft", "l4-spot", 18.5 * GIB, 19.2 * GIB, 22.0 * GIB, 1.40, 14.70,
                (19.0 * GIB, 19.2 * GIB), 0.84, 4, 2048)
TIGHT = FakeJob("ml-team-b", "gpt-tight", "t4-spot", 12.0 * GIB, 14.3 * GIB, 14.6 * GIB, 0.44, 4.10,
                (14.1 * GIB, 14.25 * GIB), 1.92, 2, 1024)
JOBS = (LLAMA, TIGHT)


def operator(reg: CollectorRegistry) -> Callable[[int], None]:
    """The operator's series (memfit/metrics.py names); returns the per-tick update."""
    jobs = Gauge("memfit_jobs", "Jobs by phase.", ["namespace", "phase"], registry=reg)
    for job in JOBS:
        for phase in PHASES:
            jobs.labels(job.namespace, phase).set(1 if phase == "Running" else 0)
    gauges = {name: Gauge(name, name, JOB_LABELS, registry=reg) for name in (
        "memfit_job_predicted_peak_bytes", "memfit_job_measured_peak_bytes", "memfit_job_gpu_memory_bytes",
        "memfit_job_price_dollars_per_hour")}
    baseline = Gauge("memfit_job_baseline_price_dollars_per_hour", "b", ["namespace", "job"], registry=reg)
    savings = Gauge("memfit_job_savings_ratio", "s", ["namespace", "job"], registry=reg)
    info = Gauge("memfit_job_info", "i", [*JOB_LABELS, *PLAN], registry=reg)
    spend = Counter("memfit_job_spend_dollars", "spend", ["namespace", "job"], registry=reg)
    predicted = Gauge("memfit_job_predicted_cost_dollars", "p", ["namespace", "job"], registry=reg)
    progress = {name: Gauge(name, name, ["namespace", "job"], registry=reg) for name in (
        "memfit_job_progress_step", "memfit_job_max_steps", "memfit_job_loss", "memfit_job_eval_loss",
        "memfit_job_tokens_per_second", "memfit_job_eta_seconds")}
    for j in JOBS:
        spend.labels(j.namespace, j.name).inc(j.price_per_hour / 4)  # a quarter hour spent so far
        predicted.labels(j.namespace, j.name).set(j.price_per_hour * 10)
        key = (j.namespace, j.name, j.pool)
        gauges["memfit_job_predicted_peak_bytes"].labels(*key).set(j.predicted_bytes)
        gauges["memfit_job_measured_peak_bytes"].labels(*key).set(j.measured_bytes)
        gauges["memfit_job_gpu_memory_bytes"].labels(*key).set(j.gpu_bytes)
        gauges["memfit_job_price_dollars_per_hour"].labels(*key).set(j.price_per_hour)
        baseline.labels(j.namespace, j.name).set(j.baseline_per_hour)
        savings.labels(j.namespace, j.name).set(1 - j.price_per_hour / j.baseline_per_hour)
        info.labels(*key, *PLAN.values()).set(1)
        progress["memfit_job_progress_step"].labels(j.namespace, j.name).set(120)
        progress["memfit_job_max_steps"].labels(j.namespace, j.name).set(1000)
        progress["memfit_job_loss"].labels(j.namespace, j.name).set(2.31)
        progress["memfit_job_eval_loss"].labels(j.namespace, j.name).set(2.45)
        progress["memfit_job_tokens_per_second"].labels(j.namespace, j.name).set(
            j.micro_batch * j.sequence_length / j.step_seconds)
        progress["memfit_job_eta_seconds"].labels(j.namespace, j.name).set(880 * j.step_seconds)
    replans = Counter("memfit_replans", "r", ["namespace", "reason"], registry=reg)
    replans.labels("ml-team-a", "NoCapacity").inc()
    failures = Counter("memfit_profiling_failures", "f", ["namespace"], registry=reg)
    failures.labels("ml-team-a")
    errors = Counter("memfit_reconcile_errors", "e", ["kind"], registry=reg)
    errors.labels("MemoryOptimizedTrainingJob")
    profile = Histogram("memfit_profile_duration_seconds", "p", buckets=(10, 30, 60, 120, 300, 600),
                        registry=reg)
    plan = Histogram("memfit_plan_duration_seconds", "p", buckets=(0.001, 0.005, 0.01, 0.025, 0.05),
                     registry=reg)
    Gauge("memfit_build_info", "v", ["version"], registry=reg).labels("0.1.0").set(1)

    def tick(n: int) -> None:
        if n % 4 == 0:  # ticks are 0.25 s: once a second
            replans.labels("ml-team-b", "OutOfMemory").inc()
            profile.observe(45 + n % 50)
            plan.observe(0.002 + (n % 9) / 1000)
        if n % 8 == 0:
            failures.labels("ml-team-b").inc()

    return tick


def trainer(job: FakeJob) -> Callable[[CollectorRegistry], Callable[[int], None]]:
    """One training job's ranks (memfit_trainer/metrics.py names; namespace/pool/pod come from the target)."""

    def build(reg: CollectorRegistry) -> Callable[[int], None]:
        labels = ["job", "rank"]
        allocated = Gauge("memfit_trainer_allocated_bytes", "a", labels, registry=reg)
        reserved = Gauge("memfit_trainer_reserved_bytes", "r", labels, registry=reg)
        peak = Gauge("memfit_trainer_peak_bytes", "p", labels, registry=reg)
        step = Histogram("memfit_trainer_step_seconds", "s", labels, registry=reg,
                         buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        samples = Counter("memfit_trainer_samples", "n", labels, registry=reg)
        tokens = Gauge("memfit_trainer_tokens_per_second", "t", labels, registry=reg)
        loss = Gauge("memfit_trainer_loss", "l", labels, registry=reg)
        plan = Gauge("memfit_trainer_plan_info", "i", [*labels, "engine", "stage", "precision", "checkpointing",
                                                        "offload", "optimizer", "micro_batch", "accumulation",
                                                        "world_size", "attempt"], registry=reg)
        for rank, peak_bytes in enumerate(job.rank_peaks_bytes):
            key = (job.name, str(rank))
            allocated.labels(*key).set(peak_bytes * 0.93)
            reserved.labels(*key).set(peak_bytes * 0.97)
            peak.labels(*key).set(peak_bytes)
            tokens.labels(*key).set(job.micro_batch * job.sequence_length / job.step_seconds)
            plan.labels(*key, "deepspeed", "2", "bf16", "selective", "none", "adamw-8bit", str(job.micro_batch), "4",
                        str(len(job.rank_peaks_bytes)), "0").set(1)

        last = [time.monotonic()]

        def tick(n: int) -> None:
            now = time.monotonic()  # by the clock, not by tick count: ticks lag on a loaded machine
            for rank in range(len(job.rank_peaks_bytes)):
                samples.labels(job.name, str(rank)).inc(job.micro_batch * (now - last[0]) / job.step_seconds)
                step.labels(job.name, str(rank)).observe(job.step_seconds)
                loss.labels(job.name, str(rank)).set(2.5 / (1 + n / 100))
            last[0] = now

        return tick

    return build


# A LoRA job on one H100 1g.10gb MIG slice: dcgm-exporter shows only the slice's memory (about 9.6 GiB).
SLICE_JOB = ("ml-team-a", "lora-slice", "slice-7x1g")
SLICE_USED_MIB, SLICE_FREE_MIB = 8900, 756
DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_PROFILE", "GPU_I_ID", "namespace", "pod",
               "container", "dra_claim_name", "dra_claim_namespace", "dra_device_name", "dra_driver_name",
               "dra_pool_name"]


def dcgm(reg: CollectorRegistry) -> Callable[[int], None]:
    """dcgm-exporter with --kubernetes: framebuffer used and free in MiB per device, labelled with the pod
    using it. LLAMA's GPUs come from the device plugin; TIGHT's were allocated by NVIDIA's DRA driver (the
    series also name the claim, the device and the driver); SLICE_JOB runs on a MIG instance (GPU_I_*),
    beside its parent GPU's own series (no pod)."""
    used = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", DCGM_LABELS, registry=reg)
    free = Gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", DCGM_LABELS, registry=reg)

    def device(labels: dict[str, str], used_mib: float, free_mib: float) -> None:
        values = [labels.get(k, "") for k in DCGM_LABELS]
        used.labels(*values).set(used_mib)
        free.labels(*values).set(free_mib)

    for rank, peak_bytes in enumerate(LLAMA.rank_peaks_bytes):
        mib = round(peak_bytes * 1.04 / 2**20)
        device({"gpu": str(rank), "UUID": f"GPU-0{rank}", "device": f"nvidia{rank}", "modelName": "NVIDIA L4",
                "Hostname": "node-0", "namespace": LLAMA.namespace, "pod": f"{LLAMA.name}-train-0-{rank}-x7k2p",
                "container": "trainer"}, mib, 23034 - mib)
    for rank, peak_bytes in enumerate(TIGHT.rank_peaks_bytes):
        mib = round(peak_bytes * 1.04 / 2**20)
        claim = f"{TIGHT.name}-train-0-{rank}-x7k2p-gpus-q8v4d"
        device({"gpu": str(rank), "UUID": f"GPU-1{rank}", "device": f"nvidia{rank}", "modelName": "Tesla T4",
                "Hostname": "node-1", "namespace": TIGHT.namespace, "pod": f"{TIGHT.name}-train-0-{rank}-x7k2p",
                "container": "trainer", "dra_claim_name": claim, "dra_claim_namespace": TIGHT.namespace,
                "dra_device_name": f"gpu-{rank}", "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": "node-1"},
               mib, 15360 - mib)
    ns, name, _ = SLICE_JOB
    parent = {"gpu": "0", "UUID": "GPU-20", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
              "Hostname": "node-2"}
    device(parent, 9800, 71759)
    device({**parent, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "9", "namespace": ns, "pod": f"{name}-train-0-0-m4c1z",
            "container": "trainer"}, SLICE_USED_MIB, SLICE_FREE_MIB)
    return lambda n: None


ROLES: dict[str, Callable[[CollectorRegistry], Callable[[int], None]]] = {
    "operator": operator, "trainer-llama": trainer(LLAMA), "trainer-tight": trainer(TIGHT), "dcgm": dcgm,
}


def main(role: str) -> int:
    registry = CollectorRegistry()
    tick = ROLES[role](registry)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(server.server_port, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    n = 0
    while not stop.wait(0.25):
        tick(n)
        n += 1
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

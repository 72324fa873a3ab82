"""The memfit Grafana dashboard as plain data: rows of panels, each with PromQL targets (no Grafana SDK)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

PanelKind = Literal["timeseries", "stat", "table"]

# Template variables (Grafana regex context: "All" is ".*", several values become "(a|b)").
NS = 'namespace=~"$namespace"'
NS_JOB = f'{NS}, job=~"$job"'
NS_JOB_POOL = f'{NS_JOB}, pool=~"$pool"'
OPERATOR_JOB = 'job="memfit-operator"'  # the chart's ServiceMonitor jobLabel; see docs/observability.md
# memfit's pods: `<job>-profile-<id>` and `<job>-train-<attempt>-<rank>-<id>` (not dcgm-exporter's own pod,
# nor a MIG parent GPU's series, which has no pod)
MEMFIT_PODS = 'pod=~"($job)-(profile|train-[0-9]+)-.+"'


def dcgm(metric: str) -> str:
    """A dcgm-exporter series (with --kubernetes) of memfit's pods. Device-plugin and DRA mode both label
    the pod using a device `namespace`/`pod` (DRA mode adds `dra_claim_name`, `dra_device_name`...); on a
    MIG slice the series is the GPU instance's (`GPU_I_PROFILE`, `GPU_I_ID`)."""
    return f"{metric}{{{NS}, {MEMFIT_PODS}}}"


@dataclass(frozen=True, slots=True)
class Target:
    """One PromQL query of a panel; `legend` is a Grafana legend format."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    kind: PanelKind
    targets: tuple[Target, ...]
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    stacked: bool = False
    min_value: float | None = None
    max_value: float | None = None
    # (value, color) steps after the base color; e.g. ((0.05, "green"),) on a red base for headroom.
    thresholds: tuple[tuple[float, str], ...] = ()
    base_color: str = "green"


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    label: str
    query: str  # Grafana's label_values(<series selector>, <label>)


VARIABLES = (
    Variable("namespace", "Namespace", "label_values(memfit_job_info, namespace)"),
    Variable("job", "Job", f"label_values(memfit_job_info{{{NS}}}, job)"),
    Variable("pool", "Pool", f"label_values(memfit_job_info{{{NS_JOB}}}, pool)"),
)

OVERVIEW = Row("Overview", (
    Panel("Jobs running", "stat", (Target(f'sum(memfit_jobs{{{NS}, phase="Running"}})'),), width=4, height=4,
          description="MemoryOptimizedTrainingJobs in phase Running."),
    Panel("Planned spend", "stat",
          (Target(f"sum(memfit_job_price_dollars_per_hour{{{NS_JOB_POOL}}})"),), unit="currencyUSD",
          width=5, height=4, description="Price per hour of the planned nodes of the selected jobs."),
    Panel("Baseline spend", "stat",
          (Target(f"sum(memfit_job_baseline_price_dollars_per_hour{{{NS_JOB}}})"),), unit="currencyUSD",
          width=5, height=4, description="What the selected jobs would cost per hour on their baseline pools."),
    Panel("Savings vs baseline", "stat", (Target(
        f"1 - sum(memfit_job_price_dollars_per_hour{{{NS_JOB_POOL}}}) / sum(memfit_job_baseline_price_dollars_per_hour"
        f"{{{NS_JOB}}} and on (namespace, job) memfit_job_price_dollars_per_hour{{{NS_JOB_POOL}}})"),),
          unit="percentunit", width=5, height=4, description="1 - plan $/h / baseline $/h, weighted by price."),
    Panel("Operator up", "stat", (Target(f"sum(up{{{OPERATOR_JOB}}})"),), width=5, height=4,
          thresholds=((1, "green"),), base_color="red",
          description="memfit operator targets Prometheus scrapes successfully (expect 1)."),
))

MEMORY = Row("Memory", (
    Panel("Per-GPU peak: predicted vs measured vs capacity", "timeseries", (
        Target(f"max by (namespace, job, pool) (memfit_job_predicted_peak_bytes{{{NS_JOB_POOL}}})",
               "{{job}} predicted"),
        Target(f"max by (namespace, job, pool) (memfit_job_measured_peak_bytes{{{NS_JOB_POOL}}})",
               "{{job}} measured"),
        Target(f"max by (namespace, job, pool) (memfit_trainer_peak_bytes{{{NS_JOB_POOL}}})",
               "{{job}} live peak (busiest rank)"),
        Target(f"max by (namespace, job, pool) (memfit_job_gpu_memory_bytes{{{NS_JOB_POOL}}})",
               "{{job}} GPU capacity ({{pool}})"),
    ), unit="bytes", min_value=0, description="Planner prediction, the operator's measured peak, the "
          "trainers' live peak and the usable memory of one GPU of the chosen pool."),
    Panel("Memory headroom", "timeseries", (Target(
        f"1 - max by (namespace, job) (memfit_trainer_peak_bytes{{{NS_JOB_POOL}}}) / on (namespace, job) "
        f"max by (namespace, job) (memfit_job_gpu_memory_bytes{{{NS_JOB_POOL}}})", "{{job}}"),),
          unit="percentunit", min_value=0, max_value=1, thresholds=((0.05, "orange"), (0.1, "green")),
          base_color="red", description="Free share of the GPU's usable memory at the busiest rank's peak. "
          "Alert MemfitJobMemoryHeadroomLow under 5 %."),
    Panel("Prediction error", "timeseries", (Target(
        f"(memfit_job_measured_peak_bytes{{{NS_JOB_POOL}}} - memfit_job_predicted_peak_bytes{{{NS_JOB_POOL}}}) "
        f"/ memfit_job_predicted_peak_bytes{{{NS_JOB_POOL}}}", "{{job}} ({{pool}})"),),
          unit="percentunit", description="(measured - predicted) / predicted peak; positive = under-predicted. "
          "Alert MemfitPredictionErrorHigh beyond ±15 %."),
    Panel("Allocated and reserved per rank", "timeseries", (
        Target(f"memfit_trainer_allocated_bytes{{{NS_JOB_POOL}}}", "{{job}} rank {{rank}} allocated"),
        Target(f"memfit_trainer_reserved_bytes{{{NS_JOB_POOL}}}", "{{job}} rank {{rank}} reserved"),
    ), unit="bytes", min_value=0, description="The trainers' allocator view per rank."),
    Panel("GPU framebuffer used (DCGM)", "timeseries", (Target(
        f"sum by (namespace, pod, GPU_I_PROFILE) ({dcgm('DCGM_FI_DEV_FB_USED')}) * 1048576",
        "{{pod}} {{GPU_I_PROFILE}}"),), unit="bytes", min_value=0,
          description="dcgm-exporter's framebuffer in use (MiB converted to bytes) of the jobs' pods, per MIG "
          "instance on a slice (GPU_I_PROFILE); the same series in device-plugin and DRA mode (docs/observability.md). "
          "Empty without dcgm-exporter."),
    Panel("GPU framebuffer headroom (DCGM)", "timeseries", (Target(
        f"1 - sum by (namespace, pod, GPU_I_PROFILE) ({dcgm('DCGM_FI_DEV_FB_USED')}) / sum by (namespace, pod, "
        f"GPU_I_PROFILE) ({dcgm('DCGM_FI_DEV_FB_USED')} + {dcgm('DCGM_FI_DEV_FB_FREE')})", "{{pod}} {{GPU_I_PROFILE}}"),),
          unit="percentunit", min_value=0, max_value=1, thresholds=((0.05, "orange"), (0.1, "green")),
          base_color="red", description="Free share of each device the jobs' pods hold, as DCGM measures it: a "
          "whole GPU, or on a MIG slice the instance's own memory (used / (used + free) of that instance)."),
))

TRAINING = Row("Training", (
    Panel("Step time", "timeseries", (
        Target(f"max by (namespace, job) (rate(memfit_trainer_step_seconds_sum{{{NS_JOB_POOL}}}[$__rate_interval]) "
               f"/ rate(memfit_trainer_step_seconds_count{{{NS_JOB_POOL}}}[$__rate_interval]))", "{{job}} mean"),
        Target(f"histogram_quantile(0.9, sum by (namespace, job, le) (rate(memfit_trainer_step_seconds_bucket"
               f"{{{NS_JOB_POOL}}}[$__rate_interval])))", "{{job}} p90"),
    ), unit="s", min_value=0, width=6, description="Optimizer step wall time: slowest rank's mean, and p90."),
    Panel("Samples per second", "timeseries", (Target(
        f"sum by (namespace, job) (rate(memfit_trainer_samples_total{{{NS_JOB_POOL}}}[$__rate_interval]))",
        "{{job}}"),), unit="short", min_value=0, width=6),
    Panel("Tokens per second", "timeseries", (Target(
        f"sum by (namespace, job) (memfit_trainer_tokens_per_second{{{NS_JOB_POOL}}})", "{{job}}"),),
          unit="short", min_value=0, width=6),
    Panel("Loss", "timeseries", (Target(
        f"avg by (namespace, job) (memfit_trainer_loss{{{NS_JOB_POOL}}})", "{{job}}"),), width=6),
    Panel("Loss: training and evaluation (status.progress)", "timeseries", (
        Target(f"max by (namespace, job) (memfit_job_loss{{{NS_JOB}}})", "{{job}} train"),
        Target(f"max by (namespace, job) (memfit_job_eval_loss{{{NS_JOB}}})", "{{job}} eval"),
    ), width=8, description="The losses the operator reads from rank 0 about every 15 s (status.progress); "
          "eval only when the job evaluates."),
    Panel("Job throughput (status.progress)", "timeseries", (Target(
        f"max by (namespace, job) (memfit_job_tokens_per_second{{{NS_JOB}}})", "{{job}}"),),
          unit="short", min_value=0, width=8,
          description="Tokens per second of the whole job: rank 0's rate x the data-parallel ranks."),
    Panel("Progress and ETA", "timeseries", (
        Target(f"max by (namespace, job) (memfit_job_progress_step{{{NS_JOB}}}) / on (namespace, job) "
               f"max by (namespace, job) (memfit_job_max_steps{{{NS_JOB}}})", "{{job}} done"),
    ), unit="percentunit", min_value=0, max_value=1, width=8,
          description="step / maxSteps; the ETA is status.progress.eta (kubectl get motj) and "
                      "memfit_job_eta_seconds."),
))

COST = Row("Cost", (
    Panel("Price per hour: plan vs baseline", "timeseries", (
        Target(f"sum by (namespace, job) (memfit_job_price_dollars_per_hour{{{NS_JOB_POOL}}})", "{{job}} plan"),
        Target(f"sum by (namespace, job) (memfit_job_baseline_price_dollars_per_hour{{{NS_JOB}}})",
               "{{job}} baseline"),
    ), unit="currencyUSD", min_value=0),
    Panel("Savings vs baseline per job", "timeseries", (Target(
        f"memfit_job_savings_ratio{{{NS_JOB}}}", "{{job}}"),), unit="percentunit", max_value=1),
    Panel("Spend: predicted vs actual", "timeseries", (
        Target(f"sum by (namespace, job) (memfit_job_predicted_cost_dollars{{{NS_JOB}}})", "{{job}} predicted"),
        Target(f"sum by (namespace, job) (memfit_job_spend_dollars_total{{{NS_JOB}}})", "{{job}} spent"),
    ), unit="currencyUSD", min_value=0,
          description="The plan's estimated total cost beside the actual spend so far (GPU-hours x price of "
                      "every finished profiling run and attempt, failed ones included)."),
    Panel("Plans", "table", (
        Target(f"memfit_job_info{{{NS_JOB_POOL}}}", instant=True, table=True),
        Target(f"memfit_trainer_plan_info{{{NS_JOB_POOL}}}", instant=True, table=True),
    ), width=24, description="The chosen configuration per job (operator) and per rank (trainer)."),
))

OPERATOR = Row("Operator", (
    Panel("Jobs by phase", "timeseries", (Target(
        f"sum by (phase) (memfit_jobs{{{NS}}})", "{{phase}}"),), stacked=True, min_value=0),
    Panel("Re-plans by reason (per hour)", "timeseries", (Target(
        f"sum by (namespace, reason) (increase(memfit_replans_total{{{NS}}}[1h]))", "{{namespace}} {{reason}}"),),
          min_value=0, description="OutOfMemory, NoCapacity, HostOutOfMemory."),
    Panel("Profiling failures (per hour)", "timeseries", (Target(
        f"sum by (namespace) (increase(memfit_profiling_failures_total{{{NS}}}[1h]))", "{{namespace}}"),),
          min_value=0, width=8),
    Panel("Profile and plan duration (p90)", "timeseries", (
        Target("histogram_quantile(0.9, sum by (le) (rate(memfit_profile_duration_seconds_bucket"
               "[$__rate_interval])))", "profile p90"),
        Target("histogram_quantile(0.9, sum by (le) (rate(memfit_plan_duration_seconds_bucket"
               "[$__rate_interval])))", "plan p90"),
    ), unit="s", min_value=0, width=8),
    Panel("Reconcile errors", "timeseries", (Target(
        "sum by (kind) (rate(memfit_reconcile_errors_total[$__rate_interval]))", "{{kind}}"),),
          unit="reqps", min_value=0, width=8),
))

ROWS = (OVERVIEW, MEMORY, TRAINING, COST, OPERATOR)

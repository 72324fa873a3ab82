"""Profiling a job's own container (`spec.container`) with memfit's probe, and what its points teach.

The profiling pod runs memfit's profiler on `spec.problem`, then the user's command under the probe
(memfit.kube.probe_pod) at micro-batches 1 and 2 of one configuration: the precision, checkpointing and
8-bit choice the job pins, else bf16 (fp16 on a GPU without bf16), no checkpointing, 32-bit optimizer, one
process (for a script that takes memfit's DeepSpeed config, that configuration's config, ZeRO stage 0, which the
probe rewrites per micro-batch). Each measured step peak is stored with the profile as an observation of that configuration, like an
attempt's measured peak (memfit.lifecycle.learning), and the planner learns it the same way
(memfit.planner.measured): the probed configuration's predictions are scaled by the script's measured /
predicted ratio, every other configuration by the largest ratio above 1 (a script that allocates more than
its model makes every unmeasured plan more cautious; one that allocates less never shrinks them).

A finding (the script ignores the micro-batch, never steps an optimizer, exits early, hangs) fails the
profiling with the probe's words; the pod itself succeeds (`--report-only`), so the Job never reruns a
script that will do the same again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from memfit.api import pod as contract
from memfit.api.common import Checkpointing, Offload, Precision, Toggle
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.own_code import Knob, OwnContainer
from memfit.api.plan import MemoryBreakdown, Plan
from memfit.api.termination import DEVICE_CPU
from memfit.api.training_config import TrainingConfig
from memfit.catalog import GPUModel
from memfit.kube.probe_pod import ProbeRun
from memfit.kube.profile_cache import KIND_ALLOCATED, Observation
from memfit.lifecycle.observed import JobSummary
from memfit.lifecycle.planning import training_config_key

PROBE_MICRO_BATCHES = (1, 2)
PROBE_STEPS = 3
PROBE_CHECKPOINTS = "/tmp/memfit-probe/checkpoints"  # never the job's folder: a probed run must not resume
PROBE_OUTPUT = "/tmp/memfit-probe/output"
MIN_BUDGET_SECONDS = 30
DEADLINE_MARGIN_SECONDS = 30


def not_probed(spec: MemoryOptimizedTrainingJobSpec) -> str:
    """Why a job's own container is not probed ("" when it is; also "" for memfit's own trainer, which the
    profiler measures itself)."""
    own = spec.container
    if own is None:
        return ""
    if not own.probe:
        return "spec.container.probe is false"
    if not own.command:
        return "spec.container.command is not set (the probe runs the command; it cannot know the image's entrypoint)"
    return ""


def probed(spec: MemoryOptimizedTrainingJobSpec) -> OwnContainer | None:
    return spec.container if spec.container is not None and not not_probed(spec) else None


def probe_config(spec: MemoryOptimizedTrainingJobSpec, gpu: GPUModel | None) -> TrainingConfig:
    """The one configuration the probe runs the script at (micro-batch 1; the probe sets each)."""
    strategy = spec.strategy
    precision = strategy.precision
    if precision == Precision.AUTO:
        precision = Precision.BF16 if gpu is None or gpu.supports_bf16 else Precision.FP16
    ckpt = strategy.activation_checkpointing
    return TrainingConfig(
        engine=spec.container.engine if spec.container else strategy.engine, zero_stage=0, precision=precision,
        activation_checkpointing=Checkpointing.NONE if ckpt == Checkpointing.AUTO else ckpt,
        offload=Offload.NONE, optimizer8bit=strategy.optimizer8bit == Toggle.ENABLED,
        micro_batch_size=1, gradient_accumulation_steps=1,
    )


def probe_micro_batches(spec: MemoryOptimizedTrainingJobSpec) -> tuple[int, ...]:
    """1 and 2, or the pinned micro-batch (a script that does not take memfit's runs its own)."""
    pinned = spec.strategy.micro_batch_size
    return (int(pinned),) if pinned != "auto" else PROBE_MICRO_BATCHES


def probe_run(spec: MemoryOptimizedTrainingJobSpec, gpu: GPUModel | None) -> ProbeRun | None:
    own = probed(spec)
    if own is None:
        return None
    config = probe_config(spec, gpu)
    env = {
        contract.ENV_PRECISION: config.precision.value,
        contract.ENV_ACTIVATION_CHECKPOINTING: config.activation_checkpointing.value,
        contract.ENV_OPTIMIZER_8BIT: "true" if config.optimizer8bit else "false",
        contract.ENV_ZERO_STAGE: "0",
        contract.ENV_GLOBAL_BATCH_SIZE: str(spec.training.global_batch_size),
        contract.ENV_LEARNING_RATE: repr(spec.training.learning_rate),
        contract.ENV_CHECKPOINT_DIR: PROBE_CHECKPOINTS,
        contract.ENV_OUTPUT_DIR: PROBE_OUTPUT,
        contract.ENV_NNODES: "1", contract.ENV_NPROC_PER_NODE: "1", contract.ENV_TORCHRUN_NODE_RANK: "0",
        contract.ENV_MASTER_ADDR: "127.0.0.1", contract.ENV_MASTER_PORT: "29500",
    }  # fmt: skip
    batches = probe_micro_batches(spec)
    # The profiler and every probed run share the Job's deadline; the probe ends its ladder a margin before it
    # (the pod's scheduling and image pulls come before the budget's start), reporting a run still going as hung.
    deadline = spec.profiling.timeout_seconds
    budget = max(MIN_BUDGET_SECONDS, deadline - max(DEADLINE_MARGIN_SECONDS, deadline // 10))
    plan_json = probe_plan(spec, config, gpu).model_dump_json(by_alias=True, exclude_none=True) if (
        Knob.DEEPSPEED_CONFIG in own.honors) else ""
    return ProbeRun(own=own, env=tuple(env.items()), micro_batches=batches, steps=PROBE_STEPS,
                    budget_seconds=budget, plan_json=plan_json)  # fmt: skip


def probe_plan(spec: MemoryOptimizedTrainingJobSpec, config: TrainingConfig, gpu: GPUModel | None) -> Plan:
    """The probed configuration as a Plan, from which memfit's config writer derives the DeepSpeed config
    (`memfit-trainer deepspeed-config`, the mapping of the training pods); the probe sets each run's batch."""
    zero = MemoryBreakdown(parameters_bytes=0, gradients_bytes=0, optimizer_bytes=0, activations_bytes=0,
                           temporaries_bytes=0, overhead_bytes=0, peak_bytes=0)  # fmt: skip
    return Plan(**config.model_dump(), nodes=1, gpus_per_node=1, node_pool="profiling",
                gpu_product=gpu.product if gpu is not None else "any", gpu_memory_bytes=0, memory=zero,
                headroom_percent=0, price_per_hour=0.0, step_seconds=0.0, estimated_hours=0.0, estimated_cost=0.0,
                training=spec.training)  # fmt: skip


def script_key(spec: MemoryOptimizedTrainingJobSpec) -> str:
    """What names a probed script in the profile cache key ("" when not probed): its image, command,
    arguments, working directory, variables and honored knobs, and the probed configuration's pins."""
    own = probed(spec)
    if own is None:
        return ""
    strategy = spec.strategy
    return json.dumps({"image": own.image, "command": own.command, "args": own.args, "workingDir": own.working_dir,
                       "env": [e.to_wire() for e in own.env or []], "honors": sorted(k.value for k in own.honors),
                       "pins": [strategy.precision.value, strategy.activation_checkpointing.value,
                                strategy.optimizer8bit.value, str(strategy.micro_batch_size)]},
                      sort_keys=True, separators=(",", ":"))  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProbeReading:
    """The probe's summary from the probe container's termination message."""

    points: tuple[dict[str, object], ...]
    findings: tuple[str, ...]

    @property
    def measured(self) -> list[dict[str, object]]:
        return [p for p in self.points if p.get("outcome") == "measured" and isinstance(p.get("peakBytes"), int)]


def read_probe(job: JobSummary) -> tuple[ProbeReading | None, str]:
    """The probe's summary, or why there is none (the probe container's last log lines)."""
    for pod in reversed(job.pods):
        if not pod.raw_message:
            continue
        try:
            wire = json.loads(pod.raw_message)
            points = tuple(p for p in wire["points"] if isinstance(p, dict))
            findings = tuple(str(f) for f in wire.get("findings") or ())
        except (ValueError, KeyError, TypeError):
            detail = pod.exit_detail() or pod.raw_message[:512]
            return None, f"the probe of spec.container wrote no summary: {detail}"
        return ProbeReading(points, findings), ""
    detail = next((p.exit_detail() for p in reversed(job.pods) if p.exit_code is not None), "")
    return None, f"the probe of spec.container wrote no summary{': ' + detail if detail else ''}"


def probe_failure(reading: ProbeReading) -> str:
    """Why the probe's points cannot be used ("" when they can): its first finding, or nothing measured."""
    if reading.findings:
        return f"spec.container under memfit's probe: {reading.findings[0]}"
    if not reading.measured:
        outcomes = ", ".join(f"micro-batch {p.get('microBatch')}: {p.get('outcome')}" for p in reading.points)
        return f"spec.container under memfit's probe: no micro-batch measured ({outcomes or 'no run'})"
    return ""


def probe_observations(reading: ProbeReading, config: TrainingConfig, *, gpu_product: str, gpu_memory_bytes: int,
                       job: str) -> tuple[Observation, ...]:  # fmt: skip
    """Each probed micro-batch as an observation of the probed configuration on one process: a measured
    step peak (allocator bytes) or, after an out-of-memory run, the GPU's memory as a lower bound."""
    out = []
    for point in reading.points:
        batch, outcome = point.get("microBatch"), point.get("outcome")
        if not isinstance(batch, int) or outcome not in ("measured", "out-of-memory"):
            continue
        peak, reserved = point.get("peakBytes"), point.get("reservedPeakBytes")
        if outcome == "measured" and not isinstance(peak, int):
            continue
        meter = str(point.get("memoryMeter") or "")
        on_cpu = str(point.get("device") or "") == DEVICE_CPU or meter.startswith("cpu")
        key = training_config_key(config.model_copy(update={"micro_batch_size": batch}), world_size=1,
                                  gpus_per_node=1)  # fmt: skip
        out.append(Observation(
            config_key=key, gpu_product=gpu_product, predicted_peak_bytes=0,
            measured_peak_bytes=peak if isinstance(peak, int) else 0, gpu_memory_bytes=gpu_memory_bytes,
            out_of_memory=outcome == "out-of-memory", job=f"{job}/probe/{batch}", kind=KIND_ALLOCATED,
            device=DEVICE_CPU if on_cpu else gpu_product,
            reserved_peak_bytes=reserved if isinstance(reserved, int) and not on_cpu else None,
        ))  # fmt: skip
    return tuple(out)


def probe_words(observations: tuple[Observation, ...], config: TrainingConfig) -> str:
    """For the Profiled condition: `spec.container probed (DDP bf16, one process): micro-batch 1: 85.3 MiB, 2: ...`."""
    parts = [f"{o.config_key.split('/')[8]}: {o.measured_peak_bytes / 2**20:.1f} MiB" if not o.out_of_memory
             else f"{o.config_key.split('/')[8]}: out of memory" for o in observations]  # fmt: skip
    where = "CPU allocator" if observations and not observations[0].on_gpu else "GPU allocator"
    return (f"spec.container probed ({config.describe(batch=False)}, one process, {where}) at micro-batch "
            f"{', '.join(parts)}; the plan is calibrated by these peaks")

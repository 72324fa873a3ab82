"""Profile a problem: build it, measure the configurations, and return the Profile contract."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from memfit.api.common import Checkpointing, Precision
from memfit.api.hashing import problem_hash
from memfit.api.job import OptimizerKind
from memfit.api.problem import Problem
from memfit.api.profile import (
    ActivationCurve,
    DepthProfile,
    Measurement,
    ModelShape,
    Profile,
    ReducedDepth,
    SkippedRun,
)

from memfit_trainer.problems import DepthNotSupported, ProblemError, TrainingProblem, build_problem
from memfit_trainer.profiler.configs import DEFAULT_CONFIGS, MAX_CONFIGS, ProfileConfig
from memfit_trainer.profiler.depth import (
    Signature,
    block_signature,
    build_full_on_meta,
    check_reduced,
    extrapolate,
    reduced_depths,
)
from memfit_trainer.profiler.errors import DepthUnavailable, ProfileInputError, ProfileRunError
from memfit_trainer.profiler.measure import (
    ConfigResult,
    CurveResult,
    ElisionUnsafe,
    MeasureOptions,
    MeasureRun,
    ModelStepError,
    measure_configs,
)
from memfit_trainer.profiler.peft_points import measure_peft_variants
from memfit_trainer.profiler.shape import count_parameters, model_shape

COMPUTE_MODES = ("auto", "full", "elide", "elide-compute")
CURVE_MODES = ("auto", "on", "off")
DEPTH_MODES = ("full", "reduced")
# Curves for user models: fp32 and bf16, without and with full checkpointing (memfit.memory.curves).
CURVE_GROUPS = tuple((p, c) for p in (Precision.FP32, Precision.BF16) for c in (Checkpointing.NONE, Checkpointing.FULL))
ERROR_MAX_CHARS = 1024  # Profile.error bound
MAX_SKIPPED = 6  # Profile.skipped bound


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """What to measure and how; the defaults are what `memfit-trainer profile` runs."""

    configs: tuple[ProfileConfig, ...] = DEFAULT_CONFIGS
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # full: real arithmetic; elide: skip all large arithmetic; elide-compute: skip only matmul and
    # attention (elide.py). auto: elide on a CPU, full on a GPU.
    compute: str = "auto"
    steps_per_config: int | None = None  # default: 1 with elided compute, 3 otherwise
    split_optimizer: bool | None = None  # default: with elided compute (measure.py)
    ddp: bool = False  # the trainer runs world size 1 without a DDP wrapper
    # auto: measure activation curves when the problem has no analytic form (entrypoints, unknown
    # Hugging Face model types); on / off force it.
    curves: str = "auto"
    # full: the whole model; reduced: the full model counted on the meta device, 1 and 2 of its
    # repeated blocks measured (depth.py), for models too large for the profiling device.
    depth: str = "full"
    seed: int = 0
    # The job allows LoRA/QLoRA: its target modules and rank, checked against the built model, and
    # the methods whose variant is measured too (bf16, no checkpointing, micro-batch 1 and 2; full
    # depth only: a depth-reduced profile leaves the PEFT prediction analytic).
    lora_targets: tuple[str, ...] = ()
    lora_rank: int = 16
    lora_dropout: float = 0.0
    peft_methods: tuple[str, ...] = ()
    qlora_quant: str = "nf4"
    qlora_double_quant: bool = True


@dataclass(slots=True)
class ProfileOutcome:
    """The Profile plus the per-configuration details the benchmark and logs use."""

    profile: Profile
    results: list[ConfigResult] = field(default_factory=list)
    elided: bool = False


def resolve_device(name: str) -> torch.device:
    """`auto` picks the first GPU when CUDA works, else the CPU."""
    if name == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ProfileInputError("device", f"{name!r} is not a device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ProfileInputError("device", f"{name} requested but CUDA is not available here")
    if device.type not in ("cpu", "cuda"):
        raise ProfileInputError("device", f"must be auto, cpu or cuda[:N], got {name!r}")
    return device


def device_label(device: torch.device) -> str:
    """`cpu`, or `cuda:<catalog key>` (`cuda:<product>` for a GPU the catalog does not know)."""
    if device.type != "cuda":
        return "cpu"
    from memfit.catalog import find_gpu

    product = torch.cuda.get_device_name(device).replace(" ", "-")
    gpu = find_gpu(product)
    return f"cuda:{gpu.key if gpu else product}"[:64]


def profile_problem(spec: Problem, options: ProfileOptions | None = None) -> ProfileOutcome:
    """Measure `spec` under the configurations; raises ProfileInputError / ProfileRunError on failure."""
    options = options or ProfileOptions()
    if options.compute not in COMPUTE_MODES:
        raise ProfileInputError(
            "compute", f"must be one of {', '.join(COMPUTE_MODES)}, got {options.compute!r}"
        )
    if options.curves not in CURVE_MODES:
        raise ProfileInputError("curves", f"must be one of {', '.join(CURVE_MODES)}, got {options.curves!r}")
    if options.depth not in DEPTH_MODES:
        raise ProfileInputError("depth", f"must be one of {', '.join(DEPTH_MODES)}, got {options.depth!r}")
    started = time.perf_counter()
    device = resolve_device(options.device)
    elide = options.compute.startswith("elide") or (options.compute == "auto" and device.type == "cpu")
    curves = options.curves == "on" or (options.curves == "auto" and _analytic_shape_missing(spec))
    try:
        plan = _depth_plan(spec, options)
    except DepthUnavailable as exc:
        return ProfileOutcome(_analytic_profile(spec, device, exc, started))
    compute_reason = None
    try:
        try:
            depth_runs = [_measure(spec, options, device, elided=elide, curves=curves, depth=d, plan=plan)
                          for d in plan.depths]
        except ElisionUnsafe as exc:
            # Values steered the model: elided allocations are not the real ones. Rerun for real.
            compute_reason = f"elided arithmetic unsafe: {exc}"[:256]
            elide = False
            depth_runs = [_measure(spec, options, device, elided=False, curves=curves, depth=d, plan=plan)
                          for d in plan.depths]
    except ModelStepError as exc:
        field = "problem.entrypoint" if spec.entrypoint is not None else "problem"
        raise ProfileInputError(field, str(exc)[: ERROR_MAX_CHARS - 64]) from exc
    except DepthUnavailable as exc:
        return ProfileOutcome(_analytic_profile(spec, device, exc, started, shape=plan.shape))
    results = [r for run, _ in depth_runs for r in run.results]
    ok = [(depth, r) for (run, _), depth in zip(depth_runs, plan.depths, strict=True)
          for r in run.results if r.error is None]
    if not ok:
        reasons = "; ".join(f"{r.config.key}: {r.error}" for r in results)
        raise ProfileRunError(f"no configuration could be measured ({reasons})"[:ERROR_MAX_CHARS])
    flops = {depth: run.flops_per_sample for (run, _), depth in zip(depth_runs, plan.depths, strict=True)}
    shape, flops_per_sample, depth_profile = plan.shape, depth_runs[0][0].flops_per_sample, None
    if plan.layers is not None:
        depth_profile = DepthProfile(layers=plan.layers, reduced=[
            counts.reduced(flops[counts.blocks])
            for _, counts in depth_runs if counts is not None
        ])
        flops_per_sample = max(0.0, extrapolate(sorted(flops.items()), plan.layers))
    elif depth_runs[0][1] is not None:
        shape = depth_runs[0][1].shape
    achieved = _achieved_tflops([(r, flops[d]) for d, r in ok])
    blocks_of = (lambda d: d) if plan.layers is not None else (lambda d: None)
    peft_points: list[Measurement] = []
    if plan.layers is None:  # the whole model was measured: measure the job's adapters on it too
        peft_points = measure_peft_variants(lambda: _build_full(spec, options), options, device=device,
                                            elide=elide, room=MAX_CONFIGS - len(ok),
                                            to_measurement=lambda r: _measurement(r, None))
    profile = Profile(
        problem_hash=problem_hash(spec),
        device=device_label(device),
        shape=shape,
        flops_per_sample=flops_per_sample,
        achieved_tflops=achieved,
        mfu=_mfu(device, [r for _, r in ok], achieved),
        measurements=[_measurement(r, blocks_of(d)) for d, r in ok] + peft_points,
        activation_curves=[_activation_curve(c, blocks_of(d))
                           for (run, _), d in zip(depth_runs, plan.depths, strict=True)
                           for c in run.curves if c.micro_batch_sizes],
        optimizer=options.optimizer.value,
        compute="elided" if elide else "full",
        compute_reason=compute_reason,
        unused_parameters=any(bool(run.unused_parameters) for run, _ in depth_runs),
        depth=depth_profile,
        skipped=_skipped(results, [r for run, _ in depth_runs for r in run.curve_refusals]),
        seconds=round(time.perf_counter() - started, 3),
    )
    return ProfileOutcome(profile, results, elide)


def _skipped(results: list[ConfigResult], curves: list[tuple[Precision, Checkpointing, str]]) -> list[SkippedRun]:
    """What the device refused, once per (kind, precision, checkpointing): configurations first."""
    found: dict[tuple[str, Precision, Checkpointing], SkippedRun] = {}
    for r in results:
        c = r.config
        if r.refused and r.error is not None:
            found.setdefault(("configuration", c.precision, c.checkpointing), SkippedRun(
                kind="configuration", precision=c.precision, checkpointing=c.checkpointing,
                micro_batch_size=c.micro_batch_size, reason=r.error))
    for precision, ckpt, reason in curves:
        found.setdefault(("curve", precision, ckpt), SkippedRun(
            kind="curve", precision=precision, checkpointing=ckpt, reason=reason))
    return list(found.values())[:MAX_SKIPPED]


@dataclass(frozen=True, slots=True)
class _DepthPlan:
    """Which depths to build: (None,) = the full model; else the reduced depths of a model of `layers`."""

    depths: tuple[int | None, ...]
    layers: int | None = None
    shape: ModelShape | None = None  # the full model's shape, counted on the meta device
    block: Signature | None = None


@dataclass(frozen=True, slots=True)
class _Counted:
    """A reduced model's counts and shape, taken when it is built."""

    blocks: int
    parameters: int
    trainable_parameters: int | None
    small_parameters: int
    buffer_bytes: int
    shape: ModelShape

    def reduced(self, flops_per_sample: float) -> ReducedDepth:
        return ReducedDepth(blocks=self.blocks, parameters=self.parameters,
                            trainable_parameters=self.trainable_parameters, small_parameters=self.small_parameters,
                            buffer_bytes=self.buffer_bytes, flops_per_sample=flops_per_sample)


def _depth_plan(spec: Problem, options: ProfileOptions) -> _DepthPlan:
    """Full depth, or (depth `reduced`) the full model counted on meta and the depths to measure."""
    if options.depth == "full":
        return _DepthPlan((None,))
    full, blocks = build_full_on_meta(spec, seed=options.seed)
    shape = model_shape(spec, full)
    if not blocks:
        raise DepthUnavailable(
            f"no repeated blocks found in {type(full.model).__name__} (no nn.ModuleList of identical-structure "
            "layers): a depth-reduced profile is not possible", shape=shape,
        )
    depths = reduced_depths(len(blocks))
    if not depths:  # 1 or 2 blocks: the reduced model is the model
        return _DepthPlan((None,))
    return _DepthPlan(depths, len(blocks), shape, block_signature(blocks[0]))


def _measure(spec: Problem, options: ProfileOptions, device: torch.device, *, elided: bool, curves: bool,
             depth: int | None, plan: _DepthPlan) -> tuple[MeasureRun, _Counted | None]:
    counted: list[_Counted] = []
    where = "problem.entrypoint" if spec.entrypoint is not None else "problem"

    def build() -> TrainingProblem:
        try:
            problem = build_problem(spec, seed=options.seed, depth=depth)
        except DepthNotSupported as exc:
            raise DepthUnavailable(str(exc)) from exc
        except ProblemError as exc:
            raise _input_error(exc) from exc
        _check_lora_targets(problem, options)
        return problem

    def on_built(problem: TrainingProblem) -> None:
        if depth is not None and plan.block is not None:
            check_reduced(problem, depth=depth, full_block=plan.block, where=where)
        counts = count_parameters(problem.model)
        counted.append(_Counted(
            blocks=depth or 0, parameters=counts.parameters,
            trainable_parameters=counts.trainable_parameters if counts.trainable_parameters != counts.parameters
            else None,
            small_parameters=counts.small_parameters, buffer_bytes=counts.buffer_bytes,
            shape=model_shape(spec, problem),
        ))

    run = measure_configs(
        build,
        options.configs,
        MeasureOptions(
            device=device,
            optimizer=options.optimizer,
            steps_per_config=options.steps_per_config or (1 if elided else 3),
            elide=elided,
            elide_memory_bound=elided and options.compute != "elide-compute",
            split_optimizer=elided if options.split_optimizer is None else options.split_optimizer,
            ddp=options.ddp,
            curves=CURVE_GROUPS if curves else (),
        ),
        on_built=on_built,
    )
    return run, (counted[-1] if counted else None)


def _analytic_profile(spec: Problem, device: torch.device, exc: DepthUnavailable, started: float, *,
                      shape: ModelShape | None = None) -> Profile:
    """No measurement: the full model's shape (from the meta device) and why it could not be reduced.
    The operator plans from the analytic model alone (condition AnalyticOnly)."""
    found = exc.shape if isinstance(exc.shape, ModelShape) else shape
    if found is None:
        raise ProfileInputError("depth", exc.detail) from exc
    return Profile(
        problem_hash=problem_hash(spec), device=device_label(device), shape=found, compute="analytic",
        compute_reason=str(exc)[:256], seconds=round(time.perf_counter() - started, 3),
    )


def _check_lora_targets(problem: TrainingProblem, options: ProfileOptions) -> None:
    """The job allows LoRA/QLoRA: its targets must be linear layers of this model's blocks."""
    if not options.lora_targets:
        return
    from memfit_trainer.strategies.peft import target_problems

    found = target_problems(problem, list(options.lora_targets), options.lora_rank)
    if found:
        raise ProfileInputError("strategy.peft.lora.targetModules", "; ".join(found))


def _build_full(spec: Problem, options: ProfileOptions) -> TrainingProblem:
    try:
        return build_problem(spec, seed=options.seed)
    except ProblemError as exc:
        raise _input_error(exc) from exc


def error_profile(spec: Problem | None, message: str, *, seconds: float = 0.0) -> Profile:
    """A Profile that only says why profiling failed (the operator shows `error` in a condition)."""
    digest = problem_hash(spec) if spec is not None else "invalid"
    return Profile(problem_hash=digest, error=message[:ERROR_MAX_CHARS], seconds=round(seconds, 3))


def _input_error(exc: ProblemError) -> ProfileInputError:
    message = str(exc)
    head, sep, rest = message.partition(" ")
    if sep and head.startswith("problem"):
        return ProfileInputError(head.rstrip(":"), rest)
    return ProfileInputError("problem", message)


def _analytic_shape_missing(spec: Problem) -> bool:
    """True for problems memfit.memory has no analytic shape for (their activations are measured)."""
    try:
        from memfit.memory.problems import shape_from_problem

        shape_from_problem(spec)
    except ValueError:
        return True
    return False


def _activation_curve(curve: CurveResult, blocks: int | None) -> ActivationCurve:
    return ActivationCurve(
        blocks=blocks,
        precision=curve.precision,
        checkpointing=curve.checkpointing,
        gradients_held=curve.gradients_held,
        micro_batch_sizes=list(curve.micro_batch_sizes),
        peak_bytes=list(curve.peak_bytes),
        saved_bytes_per_sample=curve.saved_bytes_per_sample,
    )


def _measurement(result: ConfigResult, blocks: int | None) -> Measurement:
    c = result.config
    return Measurement(
        blocks=blocks,
        precision=c.precision,
        checkpointing=c.checkpointing,
        micro_batch_size=c.micro_batch_size,
        optimizer8bit=c.optimizer8bit,
        peak_allocated_bytes=result.peak_allocated_bytes,
        peak_reserved_bytes=result.peak_reserved_bytes,
        peak_backward_bytes=result.backward_peak_bytes,
        peak_step_bytes=result.step_peak_bytes,
        step_seconds=round(result.step_seconds, 4),
    )


def _achieved_tflops(results: list[tuple[ConfigResult, float]]) -> float | None:
    """Best model-FLOP rate over the configurations without recomputation ((result, its model's FLOPs
    per sample): a depth-reduced profile's models differ in FLOPs)."""
    rates = [
        flops * r.config.micro_batch_size / r.step_seconds / 1e12
        for r, flops in results
        if r.config.checkpointing == Checkpointing.NONE and r.step_seconds > 0 and flops > 0
    ]
    return round(max(rates), 6) if rates else None


def _mfu(device: torch.device, results: list[ConfigResult], achieved: float | None) -> float | None:
    """Achieved / datasheet peak of the catalog GPU (bf16 tensor cores when bf16 was measured)."""
    if achieved is None or device.type != "cuda":
        return None
    from memfit.catalog import find_gpu

    gpu = find_gpu(device_label(device).removeprefix("cuda:"))
    if gpu is None:
        return None
    bf16 = any(r.config.precision == Precision.BF16 for r in results)
    peak = gpu.bf16_tflops if bf16 and gpu.bf16_tflops else gpu.fp32_tflops
    return round(min(1.0, achieved / peak), 4) if peak else None

"""Calibration of the analytic model from a Profile's measured points.

The profiler runs the model on one device (single process, DDP-wrapped, no sharding) at a few
configurations, each with at least two micro-batch sizes, and reports each configuration's peak and,
separately, the peak of forward+backward (`peak_backward_bytes`) and of the optimizer step
(`peak_step_bytes`). Per (precision, checkpointing) group:

- backward peaks are `intercept + slope x micro_batch` in the model (the activation phase is linear in
  b). The slope is fitted by least squares over the group's points (two micro-batches are enough);
  `activation_scale = measured slope / analytic slope` multiplies the per-sample terms of every
  strategy with that precision and checkpointing, at any engine, world size and micro-batch
  (activations do not shard under data parallelism, and they are the same tensors on any device).
- intercept - analytic fixed bytes of that phase = `fixed_residual`: bytes the analytic model does not
  know about (autocast caches, library buffers). It is a fact about the engine and device that were
  measured, so it is added only to strategies with the profiled engine (DDP) on the profiled device.
- the step peak - analytic step total = `step_residual` (per 32/8-bit optimizer), under the same rule.
- A profile without phase peaks (older profilers) gives each point to the phase the analytic model
  puts its peak in. A group with a single micro-batch cannot separate slope from intercept: its
  whole error goes to the fixed residual.
- Where `peak_reserved_bytes` is present (CUDA profiles), the median reserved/allocated ratio
  replaces the default fragmentation factor.

Activation curves (profiles of user code, `Profile.activationCurves`) are measured per-sample terms:
`memfit.memory.curves.fit_curve` turns each into a line (and a plateau) above the step's start, and
for that (precision, checkpointing) they replace the analytic activation terms of every DDP strategy
(bare model at world size 1; DDP with gradient bucket views at 2+ or with accumulation) and give the
per-sample bytes of the other engines. Measurement wins over the analytic prior; `sources` says per
term which one a prediction used.

Groups without a measurement borrow the nearest measured group: same checkpointing, then same
precision, then the mean of all groups; the residual only from the same precision. Borrowed
corrections only ever raise a prediction (scale >= 1, residual >= 0): a measurement of one
configuration must not make an unmeasured one look smaller than the model says.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from memfit.api.common import Checkpointing, Engine, PeftMethod, Precision
from memfit.api.job import OptimizerKind
from memfit.api.profile import Measurement, Profile
from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.memory import depth
from memfit.memory.curves import CurveFit, fit_curve, least_squares
from memfit.memory.predict import memory_terms
from memfit.memory.shape import Shape
from memfit.memory.strategy import Device, Strategy

# Bounds on the fitted factors: outside them the profile is more likely wrong than the model.
MIN_ACTIVATION_SCALE, MAX_ACTIVATION_SCALE = 0.5, 2.0
MIN_FRAGMENTATION, MAX_FRAGMENTATION = 1.0, 2.0
# A group whose measurements the analytic model already reproduces within this share is left alone:
# fitting two nearly-equal points would only turn measurement noise into a slope.
AGREEMENT = 0.02

GroupKey = tuple[Precision, Checkpointing]
CurveKey = tuple[Precision, Checkpointing, bool]  # (precision, checkpointing, gradients held)
MEASURED, ANALYTIC = "measured", "analytic"


def _empty() -> Mapping[GroupKey, float]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Calibration:
    """Fitted corrections; an empty Calibration changes nothing (except fragmentation if set)."""

    activation_scales: Mapping[GroupKey, float] = field(default_factory=_empty)
    fixed_residuals: Mapping[GroupKey, float] = field(default_factory=_empty)
    step_residuals: Mapping[bool, float] = field(default_factory=lambda: MappingProxyType({}))
    fragmentation: float | None = None
    device: Device = Device.CUDA  # where the profile was measured
    notes: tuple[str, ...] = ()
    curves: Mapping[CurveKey, CurveFit] = field(default_factory=lambda: MappingProxyType({}))
    optimizer: OptimizerKind | None = None  # the profile's optimizer; None: any (older profiles)
    # Measured peaks of the job's LoRA/QLoRA variant: (method, precision, checkpointing, micro-batch,
    # peak allocated bytes); used for PEFT strategies only (memory/peft_calibration.py).
    peft_points: tuple[tuple[PeftMethod, Precision, Checkpointing, int, int], ...] = ()

    def fragmentation_only(self) -> Calibration:
        """Only the measured fragmentation: what carries to a LoRA/QLoRA strategy, whose tensors the
        full fine-tune's activation and residual fits do not describe."""
        return Calibration(fragmentation=self.fragmentation, device=self.device, optimizer=self.optimizer,
                           peft_points=self.peft_points)

    def curve(self, strategy: Strategy, *, held: bool) -> CurveFit | None:
        """The measured curve for this strategy's precision and checkpointing (held or bare gradients);
        the other one when only it has a measured line."""
        key = (strategy.config.precision, strategy.config.activation_checkpointing)
        first = self.curves.get((*key, held))
        if first is not None and first.measured:
            return first
        other = self.curves.get((*key, not held))
        return other if other is not None and other.measured else None

    def sources(self, strategy: Strategy) -> dict[str, str]:
        """Per term, whether this strategy's prediction rests on the profile (`measured`) or on the
        analytic model (`analytic`)."""
        if strategy.config.peft != PeftMethod.NONE:
            measured = self.peft_measured_like(strategy)
            return {"parameters": ANALYTIC, "optimizer": ANALYTIC, "activations": MEASURED if measured else ANALYTIC,
                    "step": ANALYTIC, "fragmentation": MEASURED if self.fragmentation is not None else ANALYTIC}
        key = (strategy.config.precision, strategy.config.activation_checkpointing)
        activations = MEASURED if (self.curve(strategy, held=False) is not None
                                   or key in self.activation_scales) else ANALYTIC
        step = (MEASURED if self._measured_like(strategy) and self._same_optimizer(strategy) and self.step_residuals
                else ANALYTIC)
        return {"parameters": ANALYTIC, "optimizer": ANALYTIC, "activations": activations, "step": step,
                "fragmentation": MEASURED if self.fragmentation is not None else ANALYTIC}

    def peft_measured_like(self, strategy: Strategy) -> bool:
        """The profile measured this strategy's PEFT method, on its device, and it runs on DDP (as the
        profiled bare model does): its points correct the prediction."""
        return (strategy.config.engine == Engine.DDP and strategy.device == self.device
                and any(p[0] == strategy.config.peft for p in self.peft_points))

    def _measured_like(self, strategy: Strategy) -> bool:
        """Residuals describe the profiled engine (DDP) on the profiled device only, and only a run
        without the techniques the profile does not use (bf16-pure, the optimizer step in backward, the
        chunked loss: they change the very tensors a residual stands for)."""
        return (strategy.config.engine == Engine.DDP and strategy.device == self.device
                and not strategy.uses_techniques)

    def activation_scale(self, strategy: Strategy) -> float:
        """Factor on the per-sample terms of this strategy's precision and checkpointing.

        Fitted on the profiled engine and device; carried to other engines or devices (and to
        unmeasured groups) only when it raises the prediction.
        """
        precision, checkpointing = strategy.config.precision, strategy.config.activation_checkpointing
        scales = self.activation_scales
        if not scales:
            return 1.0
        exact = scales.get((precision, checkpointing))
        if exact is not None:
            return exact if self._measured_like(strategy) else max(1.0, exact)
        for matches in (
            [v for (_, c), v in scales.items() if c == checkpointing],
            [v for (p, _), v in scales.items() if p == precision],
        ):
            if matches:
                return max(1.0, statistics.fmean(matches))
        return max(1.0, statistics.fmean(scales.values()))

    def step_residual(self, strategy: Strategy) -> float:
        """Unmodelled bytes of the optimizer step for this strategy (0 unless measured like it)."""
        if not self._measured_like(strategy) or not self._same_optimizer(strategy):
            return 0.0
        exact = self.step_residuals.get(strategy.config.optimizer8bit)
        if exact is not None:
            return exact
        return max(0.0, statistics.fmean(self.step_residuals.values())) if self.step_residuals else 0.0

    def _same_optimizer(self, strategy: Strategy) -> bool:
        """A step residual measured with AdamW says nothing about SGD's step (issue 14, item 5)."""
        return self.optimizer is None or self.optimizer == strategy.optimizer

    def fixed_residual(self, strategy: Strategy) -> float:
        """Unmodelled bytes alive with the activations (0 unless measured like it)."""
        if not self._measured_like(strategy):
            return 0.0
        precision, checkpointing = strategy.config.precision, strategy.config.activation_checkpointing
        exact = self.fixed_residuals.get((precision, checkpointing))
        if exact is not None:
            return exact
        same = [v for (p, _), v in self.fixed_residuals.items() if p == precision]
        return max(0.0, statistics.fmean(same)) if same else 0.0


def _profile_strategy(m: Measurement, optimizer: OptimizerKind, device: Device) -> Strategy:
    # The profiler measures DDP on one device (Measurement carries only what it varied).
    config = PLAIN_FP32_DDP.model_copy(update={
        "precision": m.precision, "activation_checkpointing": m.checkpointing,
        "optimizer8bit": m.optimizer8bit, "micro_batch_size": m.micro_batch_size,
    })
    return Strategy(config=config, optimizer=optimizer, device=device)


def profile_device(profile: Profile) -> Device:
    """The Profile's `device` label (cpu or cuda:<product>) as a predictor Device."""
    return Device.CPU if profile.device.startswith("cpu") else Device.CUDA


def calibrate(profile: Profile, shape: Shape, *, optimizer: OptimizerKind | None = None) -> Calibration:
    """Fit activation scales, fixed and step residuals and fragmentation from `profile.measurements`,
    and the measured activation lines from `profile.activation_curves`.

    `optimizer` is the one the profile's steps ran with (default: the Profile's `optimizer`, else AdamW).
    A depth-reduced profile (`profile.depth`) is calibrated per measured depth and its terms scaled to
    the full model's blocks (memfit.memory.depth); `shape` is the full model's.
    """
    if profile.depth is not None:
        return _calibrate_reduced(profile, shape, optimizer=optimizer)
    return _calibrate_one(profile, shape, optimizer=optimizer)


def _calibrate_reduced(profile: Profile, shape: Shape, *, optimizer: OptimizerKind | None) -> Calibration:
    """Calibrate each measured depth against its reduced shape, then extrapolate to `depth.layers`."""
    assert profile.depth is not None
    layers = profile.depth.layers
    per: list[tuple[int, Shape, Calibration]] = []
    for reduced in sorted(profile.depth.reduced, key=lambda r: r.blocks):
        small = depth.reduced_shape(shape, reduced)
        per.append((reduced.blocks, small, _calibrate_one(depth.at_depth(profile, reduced.blocks), small,
                                                          optimizer=optimizer)))
    first = per[0][2]
    shapes = {d: small for d, small, _ in per}

    def slope(at: Shape, key: GroupKey) -> float:
        strategy = _group_strategy(key, first.optimizer or OptimizerKind.ADAMW, first.device)
        return memory_terms(at, strategy).per_sample_bytes

    noise = depth.noise_bytes(profile)
    largest_batch = max((m.micro_batch_size for m in profile.measurements), default=1)
    # The analytic per-sample error at each depth, in bytes per sample, is what scales with depth.
    errors = depth.extrapolate_map([(d, cal.activation_scales) for d, _, cal in per], layers, noise_bytes=noise,
                                   weight=largest_batch, value=lambda d, key, scale: (scale - 1) * slope(shapes[d], key))
    scales = {key: min(depth.MAX_SCALE, max(depth.MIN_SCALE, 1 + error / full)) if (full := slope(shape, key)) > 0
              else 1.0 for key, error in errors.items()}
    curves: dict[CurveKey, list[tuple[int, CurveFit]]] = {}
    for d, _, cal in per:
        for key, fit in cal.curves.items():
            curves.setdefault(key, []).append((d, fit))
    curve_batch = max((max(c.micro_batch_sizes, default=1) for c in profile.activation_curves), default=1)
    fragmentations = [cal.fragmentation for _, _, cal in per if cal.fragmentation is not None]
    blocks = ", ".join(str(d) for d, _, _ in per)
    notes = [f"depth-reduced profile: blocks {blocks} measured, terms scaled to {layers} blocks"]
    notes += [f"blocks {d}: {note}" for d, _, cal in per for note in cal.notes]
    return Calibration(
        activation_scales=depth.freeze(scales),
        fixed_residuals=depth.freeze(depth.extrapolate_map([(d, c.fixed_residuals) for d, _, c in per], layers,
                                                           noise_bytes=noise)),
        step_residuals=depth.freeze(depth.extrapolate_map([(d, c.step_residuals) for d, _, c in per], layers,
                                                          noise_bytes=noise)),
        fragmentation=max(fragmentations) if fragmentations else None,
        device=first.device,
        notes=tuple(notes),
        curves=MappingProxyType({k: depth.extrapolate_curve(v, layers, noise_bytes=noise, micro_batch=curve_batch)
                                 for k, v in curves.items()}),
        optimizer=first.optimizer,
    )


def _group_strategy(key: GroupKey, optimizer: OptimizerKind, device: Device) -> Strategy:
    config = PLAIN_FP32_DDP.model_copy(update={"precision": key[0], "activation_checkpointing": key[1]})
    return Strategy(config=config, optimizer=optimizer, device=device)


def _calibrate_one(profile: Profile, shape: Shape, *, optimizer: OptimizerKind | None) -> Calibration:
    """`calibrate` for a profile measured at one depth."""
    if optimizer is None:
        try:
            optimizer = OptimizerKind(profile.optimizer or OptimizerKind.ADAMW.value)
        except ValueError:
            optimizer = OptimizerKind.ADAMW
    device = profile_device(profile)
    # (precision, checkpointing, 8-bit) -> [(micro-batch, measured - analytic fixed, analytic slope,
    #                                        activation moment, measured)]
    groups: dict[tuple[Precision, Checkpointing, bool], list[tuple[float, float, float, int, float]]] = {}
    step_errors: dict[bool, list[float]] = {}
    notes: list[str] = []
    ratios: list[float] = []
    peft_points: list[tuple[PeftMethod, Precision, Checkpointing, int, int]] = []
    for m in profile.measurements:
        if m.peft is not None:  # the LoRA/QLoRA variant: other tensors, kept for PEFT strategies only
            peft_points.append((m.peft, m.precision, m.checkpointing, m.micro_batch_size, m.peak_allocated_bytes))
            continue
        if m.precision == Precision.AUTO or m.checkpointing == Checkpointing.AUTO:
            notes.append("skipped a measurement with precision or checkpointing auto")
            continue
        if m.peak_reserved_bytes and m.peak_allocated_bytes:
            ratios.append(m.peak_reserved_bytes / m.peak_allocated_bytes)
        strategy = _profile_strategy(m, optimizer, device)
        terms = memory_terms(shape, strategy)
        static = terms.static_bytes
        # The activation moment the model puts the peak in: the loss, the first or the last block's backward.
        moment, peak_moment = max(enumerate(terms.activation_moments(1)),
                                  key=lambda indexed: indexed[1].total(m.micro_batch_size))
        fixed, slope = static + peak_moment.fixed_bytes, peak_moment.per_sample_bytes
        activation_peak = fixed + m.micro_batch_size * slope
        step = static + terms.step_gradient_bytes + terms.step_temporary_bytes
        backward_end = static + terms.backward_end_bytes
        backward = m.peak_backward_bytes
        step_measured = m.peak_step_bytes
        if backward is None and step_measured is None:
            # No phase peaks: the point belongs to the phase the model puts the peak in.
            if step >= max(activation_peak, backward_end):
                step_measured = m.peak_allocated_bytes
            elif activation_peak >= backward_end:
                backward = m.peak_allocated_bytes
        if step_measured is not None:
            error = step_measured - step
            step_errors.setdefault(m.optimizer8bit, []).append(error if abs(error) > AGREEMENT * step_measured else 0.0)
        # Only points whose backward peak is the activations' measure them: at small micro-batches the
        # peak of backward is where it ends (all gradients), whatever the activations are.
        if backward is None or activation_peak <= backward_end or backward <= backward_end:
            notes.append(f"{m.precision.value}/{m.checkpointing.value} micro-batch {m.micro_batch_size}: "
                         "backward peak not from the activations, not used for the activation fit")
            continue
        groups.setdefault((m.precision, m.checkpointing, m.optimizer8bit), []).append(
            (float(m.micro_batch_size), backward - fixed, slope, moment, float(backward))
        )
    fitted_scales: dict[GroupKey, list[float]] = {}
    fitted_residuals: dict[GroupKey, list[float]] = {}
    for (precision, ckpt, eight), points in sorted(groups.items()):
        key: GroupKey = (precision, ckpt)
        label = f"{precision.value}/{ckpt.value}{' 8-bit' if eight else ''}"
        if all(abs(y - b * s) <= AGREEMENT * measured for b, y, s, _, measured in points):
            fitted_scales.setdefault(key, []).append(1.0)
            fitted_residuals.setdefault(key, []).append(0.0)
            notes.append(f"{label}: the analytic model is within {AGREEMENT:.0%} of every measurement, no correction")
            continue
        analytic_slope = statistics.fmean(s for _, _, s, _, _ in points)
        same_moment = len({moment for _, _, _, moment, _ in points}) == 1
        if len({b for b, _, _, _, _ in points}) >= 2 and same_moment and analytic_slope > 0:
            _, slope = least_squares([(b, y) for b, y, _, _, _ in points])
            scale = slope / analytic_slope
            if not MIN_ACTIVATION_SCALE <= scale <= MAX_ACTIVATION_SCALE:
                # Outside the bounds the points disagree with any linear activation term: keep the
                # analytic slope and let the residual absorb the level.
                notes.append(f"{label}: fitted activation scale {scale:.2f} outside "
                             f"[{MIN_ACTIVATION_SCALE}, {MAX_ACTIVATION_SCALE}], not used")
                scale = 1.0
            fitted_scales.setdefault(key, []).append(scale)
            fitted_residuals.setdefault(key, []).append(
                statistics.fmean(y - b * scale * s for b, y, s, _, _ in points)
            )
        else:
            # One micro-batch (or points at different moments of backward) cannot separate slope from
            # intercept; activations are the better-known term (checked against saved tensors), so
            # the error goes to the fixed residual.
            fitted_residuals.setdefault(key, []).append(statistics.fmean(y - b * s for b, y, s, _, _ in points))
            notes.append(f"{label}: one micro-batch size per backward moment, error assigned to the fixed residual")
    if any(m.peft is None for m in profile.measurements) and not groups and not profile.activation_curves:
        notes.append("no measured point showed the activations (every backward peak was at the gradient "
                     "plateau): activation terms are analytic; profile larger micro-batches")
    fragmentation = None
    if ratios:
        fragmentation = min(MAX_FRAGMENTATION, max(MIN_FRAGMENTATION, statistics.median(ratios)))
    curves: dict[CurveKey, CurveFit] = {}
    for curve in profile.activation_curves:
        if curve.precision == Precision.AUTO or curve.checkpointing == Checkpointing.AUTO:
            continue
        try:
            fit = fit_curve(curve.micro_batch_sizes, curve.peak_bytes)
        except ValueError as exc:
            notes.append(f"activation curve {curve.precision.value}/{curve.checkpointing.value}: {exc}")
            continue
        label = (f"{curve.precision.value}/{curve.checkpointing.value} "
                 f"{'held' if curve.gradients_held else 'bare'} gradients")
        if fit.measured:
            notes.append(f"{label}: measured {fit.per_sample_bytes / 2**20:.2f} MiB/sample on "
                         f"{fit.points_used} of {fit.points_total} micro-batches")
        else:
            notes.append(f"{label}: no micro-batch left the gradient plateau, no measured slope")
        curves[(curve.precision, curve.checkpointing, curve.gradients_held)] = fit
    measured_groups = {(p, c) for (p, c, _), f in curves.items() if f.measured}
    for key in list(fitted_scales):
        if key in measured_groups:  # the curve supersedes the scale fitted on the analytic prior
            del fitted_scales[key]
            fitted_residuals.pop(key, None)
    return Calibration(
        activation_scales=MappingProxyType({k: statistics.fmean(v) for k, v in fitted_scales.items()}),
        fixed_residuals=MappingProxyType({k: statistics.fmean(v) for k, v in fitted_residuals.items()}),
        step_residuals=MappingProxyType({k: statistics.fmean(v) for k, v in step_errors.items()}),
        fragmentation=fragmentation,
        device=device,
        notes=tuple(notes),
        curves=MappingProxyType(curves),
        optimizer=optimizer,
        peft_points=tuple(peft_points),
    )

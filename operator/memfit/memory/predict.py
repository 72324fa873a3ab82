"""The predictor: model shape + strategy (+ calibration) -> per-GPU peak with its breakdown.

Peak allocated bytes are parameters + optimizer state + persistent engine buffers plus the largest of
three phases (everything per GPU; the phase terms are in temporaries.py):

- activation peak, at the larger of two moments (activations.py): the loss (all activations, the
  loss's buffers, no gradient yet) or the first block's backward (its recomputed working set and
  gradients, plus what the engine holds by then: the head's gradients, gathered units); both with
  what is alive with the activations (gathered parameters, autocast weight copies) and, when
  accumulating, the gradients kept across micro-steps;
- backward end: the gradients as backward leaves them, with gathered units and buckets;
- optimizer step: the gradients the step holds and its scratch space (activations are freed).

Device peak = fragmentation x allocated + fixed overhead (overhead.py). Everything but the
activation terms is independent of the micro-batch b and the activation terms are linear in b, so
the largest micro-batch that fits a budget has a closed form (`MemoryTerms.max_micro_batch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from memfit.api.common import Engine, PeftMethod
from memfit.api.plan import MemoryBreakdown
from memfit.api.profile import ModelShape
from memfit.memory.activations import ActivationTerms, activation_terms
from memfit.memory.curves import CurveFit
from memfit.memory.overhead import framework_overhead
from memfit.memory.peft import peft_activation_terms, peft_phases, peft_states
from memfit.memory.peft_calibration import peft_fixed_residual
from memfit.memory.shape import Shape
from memfit.memory.states import model_states
from memfit.memory.strategy import Device, Strategy
from memfit.memory.temporaries import phase_bytes

# Activation offload on CUDA: pinned buffers come from the caching host allocator, which rounds each block
# up to a power of two (c10/cuda CachingHostAllocator), so host RAM is counted at its bound, twice the bytes.
PINNED_HOST_ROUNDING = 2.0

if TYPE_CHECKING:  # calibration.py builds on memory_terms; predict only calls a Calibration's methods
    from memfit.memory.calibration import Calibration


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Predicted per-GPU peak and its composition at the peak moment, in bytes."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    temporaries_bytes: int
    overhead_bytes: int  # CUDA context, cuBLAS, NCCL and allocator fragmentation
    peak_bytes: int
    allocated_bytes: int  # what torch.cuda.max_memory_allocated would report
    host_bytes: int  # host RAM per GPU for offload
    nvme_bytes: int  # NVMe per GPU for offload
    phase: str  # backward | backward-end | step
    reserved_bytes: int = 0
    host_activation_bytes: int = 0  # the part of host_bytes that is offloaded activations  # allocated x fragmentation: what torch.cuda.max_memory_reserved would report

    def to_breakdown(self) -> MemoryBreakdown:
        """The API's MemoryBreakdown (the Plan contract)."""
        return MemoryBreakdown(
            parameters_bytes=self.parameters_bytes,
            gradients_bytes=self.gradients_bytes,
            optimizer_bytes=self.optimizer_bytes,
            activations_bytes=self.activations_bytes,
            temporaries_bytes=self.temporaries_bytes,
            overhead_bytes=self.overhead_bytes,
            peak_bytes=self.peak_bytes,
            allocated_bytes=self.allocated_bytes,
            reserved_bytes=self.reserved_bytes,
            host_bytes=self.host_bytes,
            nvme_bytes=self.nvme_bytes,
            host_activation_bytes=self.host_activation_bytes,
        )


class ActivationMoment(NamedTuple):
    """One candidate activation peak: fixed bytes (gradients + the rest) and per-sample bytes."""

    other_bytes: float  # gathered units, autocast copies, buffers alive at this moment
    gradient_bytes: float
    activation_bytes_per_sample: float
    temporary_bytes_per_sample: float

    @property
    def fixed_bytes(self) -> float:
        return self.other_bytes + self.gradient_bytes

    @property
    def per_sample_bytes(self) -> float:
        return self.activation_bytes_per_sample + self.temporary_bytes_per_sample

    def total(self, micro_batch: int) -> float:
        """Bytes on top of the static ones at this moment."""
        return self.fixed_bytes + micro_batch * self.per_sample_bytes


@dataclass(frozen=True, slots=True)
class MemoryTerms:
    """A strategy's per-GPU memory as a function of micro-batch b and accumulation."""

    parameters_bytes: float
    optimizer_bytes: float
    persistent_bytes: float
    with_activations_bytes: float
    in_backward_gradient_bytes: float
    in_backward_bytes: float
    late_gradient_bytes: float
    late_backward_bytes: float
    held_gradient_bytes: float
    backward_end_bytes: float
    step_gradient_bytes: float
    step_temporary_bytes: float
    activation_bytes_per_sample: float
    temporary_bytes_per_sample: float
    block_activation_bytes_per_sample: float
    block_temporary_bytes_per_sample: float
    last_block_activation_bytes_per_sample: float
    overhead_bytes: float
    fragmentation: float
    host_bytes: float
    nvme_bytes: float
    # The optimizer step in backward (temporaries.py): the head's step beside every activation, a block
    # tensor's beside a block's (recomputed) activations.
    head_step_bytes: float = 0.0
    block_step_bytes: float = 0.0
    loss_extra_bytes: float = 0.0  # the chunked loss's backward only (temporaries.py)
    # Activation offload: host bytes per sample of micro-batch (activations.py), on top of `host_bytes`.
    host_bytes_per_sample: float = 0.0
    # Correction of the tensor (allocated) part from measured allocator peaks (auto-downsizing); 1 = none.
    # The fixed overhead (CUDA context, NCCL) is device-specific and is not scaled by it.
    scale: float = 1.0
    # Measured activation lines (profile curves of user code): ((fixed, per-sample), ...) without and
    # with accumulation, bytes on top of the static ones; they replace the analytic moments.
    measured_lines: tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]] | None = None
    # (fixed, per-sample) of each activation moment, without and with accumulation: derived once,
    # read on the planner's hot path.
    _lines: tuple[tuple[tuple[float, float], ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.measured_lines is not None:
            object.__setattr__(self, "_lines", self.measured_lines)
            return
        object.__setattr__(self, "_lines", (self._line_pairs(False), self._line_pairs(True)))

    def _line_pairs(self, accumulating: bool) -> tuple[tuple[float, float], ...]:
        """(fixed, per-sample) of each of `activation_moments`, summed in the same order (the planner's hot
        path: no moment objects)."""
        w, held = self.with_activations_bytes, self.held_gradient_bytes
        act, block_act = self.activation_bytes_per_sample, self.block_activation_bytes_per_sample
        block_tmp = self.block_temporary_bytes_per_sample
        moments = (
            ((w + self.loss_extra_bytes) + (held if accumulating else 0.0), act + self.temporary_bytes_per_sample),
            ((w + self.in_backward_bytes) + (held if accumulating else self.in_backward_gradient_bytes),
             block_act + block_tmp),
            (self.late_backward_bytes + (held if accumulating else self.late_gradient_bytes),
             self.last_block_activation_bytes_per_sample + block_tmp),
        )
        if self.head_step_bytes or self.block_step_bytes:
            return ((w + self.head_step_bytes) + 0.0, act + 0.0), ((w + self.block_step_bytes) + 0.0, block_act + 0.0), *moments
        return moments

    @property
    def gradients_bytes(self) -> float:
        """Gradients held by the optimizer step."""
        return self.step_gradient_bytes

    @property
    def per_sample_bytes(self) -> float:
        """Allocated bytes added by one more sample at the loss moment."""
        return self.activation_bytes_per_sample + self.temporary_bytes_per_sample

    @property
    def static_bytes(self) -> float:
        """Alive in every phase: parameters, optimizer state, persistent engine buffers."""
        return self.parameters_bytes + self.optimizer_bytes + self.persistent_bytes

    def activation_moments(self, accumulation: int) -> tuple[ActivationMoment, ...]:
        """The activation-peak moments: the loss, the first and the last block's backward. With
        accumulation every gradient is kept across micro-steps (counted once)."""
        acc = accumulation > 1
        if self.measured_lines is not None:
            return tuple(ActivationMoment(fixed, 0.0, per, 0.0) for fixed, per in self.measured_lines[acc])
        held = self.held_gradient_bytes
        steps: tuple[ActivationMoment, ...] = ()
        if self.head_step_bytes or self.block_step_bytes:
            steps = (ActivationMoment(self.with_activations_bytes + self.head_step_bytes, 0.0,
                                      self.activation_bytes_per_sample, 0.0),
                     ActivationMoment(self.with_activations_bytes + self.block_step_bytes, 0.0,
                                      self.block_activation_bytes_per_sample, 0.0))
        return (
            *steps,
            ActivationMoment(self.with_activations_bytes + self.loss_extra_bytes, held if acc else 0.0,
                             self.activation_bytes_per_sample, self.temporary_bytes_per_sample),
            ActivationMoment(self.with_activations_bytes + self.in_backward_bytes,
                             held if acc else self.in_backward_gradient_bytes,
                             self.block_activation_bytes_per_sample, self.block_temporary_bytes_per_sample),
            ActivationMoment(self.late_backward_bytes, held if acc else self.late_gradient_bytes,
                             self.last_block_activation_bytes_per_sample, self.block_temporary_bytes_per_sample),
        )

    def _fixed_phases(self) -> float:
        return max(self.backward_end_bytes, self.step_gradient_bytes + self.step_temporary_bytes)

    def allocated_bytes(self, micro_batch: int, accumulation: int) -> float:
        """Peak allocated bytes (before fragmentation and overhead)."""
        activation_peak = max(fixed + micro_batch * per for fixed, per in self._lines[accumulation > 1])
        return self.static_bytes + max(activation_peak, self._fixed_phases())

    def peak_bytes(self, micro_batch: int, accumulation: int) -> float:
        """Predicted device peak (what NVML would show for the process)."""
        allocated = self.allocated_bytes(micro_batch, accumulation)
        return self.fragmentation * allocated * self.scale + self.overhead_bytes

    def smallest_peak(self, per_gpu: int) -> tuple[float, int]:
        """The smallest peak over the micro-batches b that divide `per_gpu`, and that b.

        Within one accumulation regime the peak is non-decreasing in b (every per-sample term is
        >= 0), so with accumulation (b < per_gpu) the smallest peak is at b = 1 and without it the
        only b is `per_gpu`. The regimes differ in what they hold: accumulating keeps the gradients
        alive next to the activations, so one micro-step of the whole per-GPU batch can peak below
        b = 1. Both ends must be compared; b = 1 wins ties.
        """
        one = self.peak_bytes(1, per_gpu)
        if per_gpu <= 1:
            return one, 1
        whole = self.peak_bytes(per_gpu, 1)
        return (whole, per_gpu) if whole < one else (one, 1)

    def max_micro_batch(self, budget_bytes: float, *, accumulation_above_one: bool) -> int:
        """Largest micro-batch whose peak fits `budget_bytes` (0 when none does).

        `accumulation_above_one` selects the phase rule: with accumulation the gradients coexist with
        the activations. The answer is exact for the model because every activation moment is
        linear in b.
        """
        allocated_budget = (budget_bytes - self.overhead_bytes) / (self.fragmentation * self.scale)
        room = allocated_budget - self.static_bytes
        if self._fixed_phases() > room:
            return 0
        best = 1 << 30
        for fixed, per in self._lines[accumulation_above_one]:
            if room - fixed < per:
                return 0
            if per > 0:
                best = min(best, math.floor((room - fixed) / per * (1 + 1e-12)))
        return best

    def at(self, micro_batch: int, accumulation: int) -> MemoryEstimate:
        """The full breakdown at one micro-batch and accumulation."""
        b = micro_batch
        # (total, phase, gradients, activations, temporaries) of each moment; the largest is the peak.
        candidates = [
            (m.total(b), "backward", m.gradient_bytes, b * m.activation_bytes_per_sample,
             m.other_bytes + b * m.temporary_bytes_per_sample)
            for m in self.activation_moments(accumulation)
        ]
        candidates += [
            (self.backward_end_bytes, "backward-end", self.held_gradient_bytes, 0.0,
             self.backward_end_bytes - self.held_gradient_bytes),
            (self.step_gradient_bytes + self.step_temporary_bytes, "step", self.step_gradient_bytes, 0.0,
             self.step_temporary_bytes),
        ]
        total, phase, grads, acts, temps = max(candidates, key=lambda c: c[0])
        temps = max(0.0, temps) + self.persistent_bytes
        allocated = self.static_bytes + total
        peak = self.peak_bytes(micro_batch, accumulation)
        s = self.scale
        components = [round(x * s) for x in (self.parameters_bytes, grads, self.optimizer_bytes, acts, temps)]
        peak_int = math.ceil(peak)
        return MemoryEstimate(
            parameters_bytes=components[0],
            gradients_bytes=components[1],
            optimizer_bytes=components[2],
            activations_bytes=components[3],
            temporaries_bytes=components[4],
            overhead_bytes=max(0, peak_int - sum(components)),
            peak_bytes=peak_int,
            allocated_bytes=math.ceil(allocated * self.scale),
            host_bytes=math.ceil(self.host_bytes_at(micro_batch)),
            nvme_bytes=math.ceil(self.nvme_bytes),
            phase=phase,
            reserved_bytes=min(peak_int, math.ceil(self.fragmentation * allocated * self.scale)),
            host_activation_bytes=math.ceil(micro_batch * self.host_bytes_per_sample),
        )

    def host_bytes_at(self, micro_batch: int) -> float:
        """Host RAM per GPU at `micro_batch`: offloaded states plus offloaded activations."""
        return self.host_bytes + micro_batch * self.host_bytes_per_sample

    def scaled(self, scale: float) -> MemoryTerms:
        """The same terms with a measured correction of the tensor (allocated) bytes."""
        return replace(self, scale=scale)


def memory_terms(shape: Shape, strategy: Strategy, *, calibration: Calibration | None = None,
                 activations: ActivationTerms | None = None) -> MemoryTerms:
    """Per-GPU memory terms of `strategy` (its micro-batch and accumulation are ignored).

    `activations` may pass `activation_terms(shape, strategy)` computed earlier: they depend only on
    the precision regime and checkpointing, so the planner computes them once per pair.
    """
    layout = strategy.adapter if strategy.config.peft != PeftMethod.NONE else None
    if strategy.config.peft != PeftMethod.NONE and layout is None:
        raise ValueError("a LoRA/QLoRA strategy needs its adapter layout (Strategy.adapter)")
    peft_residual = 0.0
    if layout is not None:
        # The full fine-tune's activation and residual corrections describe other tensors: a PEFT
        # strategy takes the allocator's fragmentation and, from the profile's PEFT variant (if it was
        # measured), a fixed residual that only raises the prediction (peft_calibration.py).
        states, phases = peft_states(shape, strategy, layout), peft_phases(shape, strategy, layout)
        acts = activations if activations is not None else peft_activation_terms(shape, strategy, layout)
        if calibration is not None and calibration.peft_measured_like(strategy):
            peft_residual = peft_fixed_residual(calibration.peft_points, strategy, device=calibration.device,
                                                optimizer=calibration.optimizer,
                                                allocated=lambda s, b: memory_terms(shape, s).allocated_bytes(b, 1))
        calibration = None if calibration is None else calibration.fragmentation_only()
    else:
        states, phases = model_states(shape, strategy), phase_bytes(shape, strategy)
        acts = activations if activations is not None else activation_terms(shape, strategy)
    act_per_sample, tmp_per_sample = acts.activation_bytes_per_sample, acts.temporary_bytes_per_sample
    block_act, block_tmp = acts.block_activation_bytes_per_sample, acts.block_temporary_bytes_per_sample
    last_act = acts.last_block_activation_bytes_per_sample
    offloaded = acts.offloaded_bytes_per_sample * (PINNED_HOST_ROUNDING if strategy.device == Device.CUDA else 1.0)
    with_activations = phases.with_activations_bytes + peft_residual
    step_temporary = phases.step_temporary_bytes
    fragmentation = None
    if calibration is not None:
        scale = calibration.activation_scale(strategy)
        act_per_sample, tmp_per_sample = act_per_sample * scale, tmp_per_sample * scale
        block_act, block_tmp, last_act = block_act * scale, block_tmp * scale, last_act * scale
        offloaded *= scale
        with_activations = max(0.0, with_activations + calibration.fixed_residual(strategy))
        step_temporary = max(0.0, step_temporary + calibration.step_residual(strategy))
        fragmentation = calibration.fragmentation
    overhead = (framework_overhead(strategy) if fragmentation is None
                else framework_overhead(strategy, fragmentation=fragmentation))
    measured_lines = None
    # The profile's curves were measured with every saved activation on the device: an offloading strategy
    # keeps the analytic moments (with the profile's activation scale).
    if calibration is not None and not strategy.config.activation_offload:
        measured_lines = _measured_lines(strategy, calibration, held_gradient_bytes=phases.held_gradient_bytes)
        held = calibration.curve(strategy, held=True)
        if measured_lines is None and held is not None:
            # Other engines: the measured per-sample bytes (the same tensors) on the analytic moments.
            act_per_sample = block_act = last_act = held.per_sample_bytes
            tmp_per_sample = block_tmp = 0.0
    return MemoryTerms(
        parameters_bytes=states.parameters_bytes,
        optimizer_bytes=states.optimizer_bytes,
        persistent_bytes=phases.persistent_bytes,
        with_activations_bytes=with_activations,
        in_backward_gradient_bytes=phases.in_backward_gradient_bytes,
        in_backward_bytes=phases.in_backward_bytes,
        late_gradient_bytes=phases.late_gradient_bytes,
        late_backward_bytes=phases.late_backward_bytes,
        held_gradient_bytes=phases.held_gradient_bytes,
        backward_end_bytes=phases.backward_end_bytes,
        step_gradient_bytes=phases.step_gradient_bytes,
        step_temporary_bytes=step_temporary,
        activation_bytes_per_sample=act_per_sample,
        temporary_bytes_per_sample=tmp_per_sample,
        block_activation_bytes_per_sample=block_act,
        block_temporary_bytes_per_sample=block_tmp,
        last_block_activation_bytes_per_sample=last_act,
        overhead_bytes=overhead.fixed_bytes,
        fragmentation=overhead.fragmentation,
        host_bytes=states.host_bytes,
        nvme_bytes=states.nvme_bytes,
        measured_lines=measured_lines,
        head_step_bytes=phases.head_step_bytes,
        block_step_bytes=phases.block_step_bytes,
        loss_extra_bytes=phases.loss_extra_bytes,
        host_bytes_per_sample=offloaded,
    )


def _measured_lines(strategy: Strategy, calibration: Calibration, *, held_gradient_bytes: float
                    ) -> tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]] | None:
    """DDP strategies with measured curves: the curve's line and plateau, without and with accumulation.

    World size 1 runs the bare model: without accumulation backward creates the gradients (the bare
    curve); with it the previous micro-steps' gradients are alive (the held curve plus them). World
    size 2+ runs DDP with gradient bucket views (the held curve; the buckets are persistent bytes).
    """
    if strategy.config.engine != Engine.DDP:
        return None
    held = calibration.curve(strategy, held=True)
    if held is None:
        return None
    if strategy.world_size > 1:
        line = _fit_lines(held, 0.0)
        return line, line
    bare = calibration.curve(strategy, held=False) or held
    return _fit_lines(bare, 0.0), _fit_lines(held, held_gradient_bytes)


def _fit_lines(fit: CurveFit, extra: float) -> tuple[tuple[float, float], ...]:
    return ((fit.fixed_bytes + extra, fit.per_sample_bytes), (fit.plateau_bytes + extra, fit.plateau_per_sample_bytes))


def predict_memory(
    shape: Shape | ModelShape, strategy: Strategy, *, calibration: Calibration | None = None
) -> MemoryEstimate:
    """Per-GPU peak of `strategy` at its micro-batch and accumulation, with the breakdown."""
    hot = shape if isinstance(shape, Shape) else Shape.of(shape)
    terms = memory_terms(hot, strategy, calibration=calibration)
    return terms.at(strategy.config.micro_batch_size, strategy.config.gradient_accumulation_steps)

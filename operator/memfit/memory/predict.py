"""The predictor: model shape + strategy (+ calibration) -> per-GPU peak with its breakdown.

Peak allocated bytes are the largest of three phases (everything per GPU):

- backward, accumulation > 1: params + optimizer + gradients (kept across micro-steps)
  + activations(b) + backward temporaries(b);
- backward, accumulation = 1: params + optimizer + temporaries
  + max(activations(b) + first gradients, all gradients): with zero_grad(set_to_none=True) gradients
  are allocated while backward frees the activations, so both are never full at once;
- optimizer step: params + optimizer + gradients + step temporaries (activations are freed).

Device peak = fragmentation x allocated + fixed overhead (overhead.py). Everything but the
activation terms is independent of the micro-batch b and the activation terms are linear in b, so
the largest micro-batch that fits a budget has a closed form (`MemoryTerms.max_micro_batch`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.api.plan import MemoryBreakdown
from memfit.api.profile import ModelShape
from memfit.memory.activations import ActivationTerms, activation_terms
from memfit.memory.calibration import Calibration
from memfit.memory.overhead import framework_overhead
from memfit.memory.shape import Shape
from memfit.memory.states import model_states
from memfit.memory.strategy import Strategy
from memfit.memory.temporaries import fixed_temporaries


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
            host_bytes=self.host_bytes,
            nvme_bytes=self.nvme_bytes,
        )


@dataclass(frozen=True, slots=True)
class MemoryTerms:
    """A strategy's per-GPU memory as a function of micro-batch b and accumulation."""

    parameters_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    first_gradient_bytes: float
    backward_temporary_bytes: float
    step_temporary_bytes: float
    activation_bytes_per_sample: float
    temporary_bytes_per_sample: float
    overhead_bytes: float
    fragmentation: float
    host_bytes: float
    nvme_bytes: float
    scale: float = 1.0  # correction from measured peaks (auto-downsizing); 1 = none

    @property
    def per_sample_bytes(self) -> float:
        """Allocated bytes added by one more sample in the micro-batch."""
        return self.activation_bytes_per_sample + self.temporary_bytes_per_sample

    def allocated_bytes(self, micro_batch: int, accumulation: int) -> float:
        """Peak allocated bytes (before fragmentation and overhead)."""
        static = self.parameters_bytes + self.optimizer_bytes
        samples = micro_batch * self.per_sample_bytes
        if accumulation > 1:
            backward = self.gradients_bytes + samples
        else:
            backward = max(samples + self.first_gradient_bytes, self.gradients_bytes)
        step = self.gradients_bytes + self.step_temporary_bytes
        return static + max(self.backward_temporary_bytes + backward, step)

    def peak_bytes(self, micro_batch: int, accumulation: int) -> float:
        """Predicted device peak (what NVML would show for the process)."""
        allocated = self.allocated_bytes(micro_batch, accumulation)
        return (self.fragmentation * allocated + self.overhead_bytes) * self.scale

    def max_micro_batch(self, budget_bytes: float, *, accumulation_above_one: bool) -> int:
        """Largest micro-batch whose peak fits `budget_bytes` (0 when none does).

        `accumulation_above_one` selects the phase rule: with accumulation the gradients coexist with
        the activations. The answer is exact for the model because peak is linear in b.
        """
        allocated_budget = (budget_bytes / self.scale - self.overhead_bytes) / self.fragmentation
        static = self.parameters_bytes + self.optimizer_bytes
        if static + self.gradients_bytes + self.step_temporary_bytes > allocated_budget:
            return 0
        room = allocated_budget - static - self.backward_temporary_bytes
        if accumulation_above_one:
            room -= self.gradients_bytes
        else:
            if self.gradients_bytes > room:
                return 0
            room -= self.first_gradient_bytes
        if room < self.per_sample_bytes:
            return 0
        if self.per_sample_bytes <= 0:
            return 1 << 30
        return math.floor(room / self.per_sample_bytes * (1 + 1e-12))

    def at(self, micro_batch: int, accumulation: int) -> MemoryEstimate:
        """The full breakdown at one micro-batch and accumulation."""
        params, optim = self.parameters_bytes, self.optimizer_bytes
        samples_act = micro_batch * self.activation_bytes_per_sample
        samples_tmp = micro_batch * self.temporary_bytes_per_sample
        step_total = self.gradients_bytes + self.step_temporary_bytes
        if accumulation > 1:
            backward_total = self.backward_temporary_bytes + self.gradients_bytes + samples_act + samples_tmp
            parts = (self.gradients_bytes, samples_act, self.backward_temporary_bytes + samples_tmp)
            phase = "backward"
        elif samples_act + samples_tmp + self.first_gradient_bytes >= self.gradients_bytes:
            backward_total = (self.backward_temporary_bytes + samples_act + samples_tmp
                              + self.first_gradient_bytes)
            parts = (self.first_gradient_bytes, samples_act, self.backward_temporary_bytes + samples_tmp)
            phase = "backward"
        else:
            backward_total = self.backward_temporary_bytes + self.gradients_bytes
            parts = (self.gradients_bytes, 0.0, self.backward_temporary_bytes)
            phase = "backward-end"
        if step_total > backward_total:
            parts = (self.gradients_bytes, 0.0, self.step_temporary_bytes)
            phase = "step"
        grads, acts, temps = parts
        allocated = params + optim + grads + acts + temps
        peak = self.peak_bytes(micro_batch, accumulation)
        s = self.scale
        components = [round(x * s) for x in (params, grads, optim, acts, temps)]
        peak_int = math.ceil(peak)
        return MemoryEstimate(
            parameters_bytes=components[0],
            gradients_bytes=components[1],
            optimizer_bytes=components[2],
            activations_bytes=components[3],
            temporaries_bytes=components[4],
            overhead_bytes=max(0, peak_int - sum(components)),
            peak_bytes=peak_int,
            allocated_bytes=math.ceil(allocated),
            host_bytes=math.ceil(self.host_bytes),
            nvme_bytes=math.ceil(self.nvme_bytes),
            phase=phase,
        )

    def scaled(self, scale: float) -> MemoryTerms:
        """The same terms with a measured-peak correction factor."""
        return MemoryTerms(
            self.parameters_bytes, self.gradients_bytes, self.optimizer_bytes, self.first_gradient_bytes,
            self.backward_temporary_bytes, self.step_temporary_bytes, self.activation_bytes_per_sample,
            self.temporary_bytes_per_sample, self.overhead_bytes, self.fragmentation, self.host_bytes,
            self.nvme_bytes, scale,
        )


def memory_terms(shape: Shape, strategy: Strategy, *, calibration: Calibration | None = None,
                 activations: ActivationTerms | None = None) -> MemoryTerms:
    """Per-GPU memory terms of `strategy` (its micro-batch and accumulation are ignored).

    `activations` may pass `activation_terms(shape, strategy)` computed earlier: they depend only on
    the precision regime and checkpointing, so the planner computes them once per pair.
    """
    states = model_states(shape, strategy)
    temps = fixed_temporaries(shape, strategy)
    acts = activations if activations is not None else activation_terms(shape, strategy)
    act_per_sample, tmp_per_sample = acts.activation_bytes_per_sample, acts.temporary_bytes_per_sample
    backward_fixed = temps.backward_bytes
    step_fixed = temps.step_bytes
    fragmentation = None
    if calibration is not None:
        scale = calibration.activation_scale(strategy.precision, strategy.checkpointing)
        act_per_sample *= scale
        tmp_per_sample *= scale
        backward_fixed = max(0.0, backward_fixed + calibration.fixed_residual(strategy.precision,
                                                                               strategy.checkpointing))
        step_fixed = max(0.0, step_fixed + calibration.step_residual(strategy.precision))
        fragmentation = calibration.fragmentation
    overhead = (framework_overhead(strategy) if fragmentation is None
                else framework_overhead(strategy, fragmentation=fragmentation))
    return MemoryTerms(
        parameters_bytes=states.parameters_bytes,
        gradients_bytes=states.gradients_bytes,
        optimizer_bytes=states.optimizer_bytes,
        first_gradient_bytes=min(temps.first_gradient_bytes, states.gradients_bytes),
        backward_temporary_bytes=backward_fixed + temps.persistent_bytes,
        step_temporary_bytes=step_fixed + temps.persistent_bytes,
        activation_bytes_per_sample=act_per_sample,
        temporary_bytes_per_sample=tmp_per_sample,
        overhead_bytes=overhead.fixed_bytes,
        fragmentation=overhead.fragmentation,
        host_bytes=states.host_bytes,
        nvme_bytes=states.nvme_bytes,
    )


def predict_memory(
    shape: Shape | ModelShape, strategy: Strategy, *, calibration: Calibration | None = None
) -> MemoryEstimate:
    """Per-GPU peak of `strategy` at its micro-batch and accumulation, with the breakdown."""
    hot = shape if isinstance(shape, Shape) else Shape.of(shape)
    terms = memory_terms(hot, strategy, calibration=calibration)
    return terms.at(strategy.micro_batch_size, strategy.accumulation_steps)

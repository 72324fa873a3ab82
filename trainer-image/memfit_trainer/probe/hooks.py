"""The in-process probe: counts a script's optimizer steps and reads memory once per training step.

Installed by `startup/sitecustomize.py` into the user's unchanged process. A training step ends when the
outermost optimizer step returns: torch's global optimizer step hooks (every `torch.optim.Optimizer`
subclass runs them), nested steps (an optimizer wrapping another) counted once. DeepSpeed's ZeRO and
fp16/bf16 wrappers are not torch optimizers: they call the wrapped torch optimizer once per parameter
group (ZeRO-1/2, `stage_1_and_2.py` `step`) or per sub-group (ZeRO-3, `stage3.py` `_optimizer_step`),
and not at all on an fp16 overflow. So once the script steps a `DeepSpeedEngine`, the engine's `step` is
the training step: one where the engine's `global_steps` moved (an accumulation boundary).

The step's memory is read at the next safe point: the next outermost module call (or interpreter exit).
Not in the optimizer post hook: torch runs it inside the step's `record_function` range, and ending the
CPU meter's profiler cycle there corrupts the profiler (segfaults within ~50 steps, torch 2.15).

The micro-batch the script fed is the leading dimension of the first tensor argument of the step's first
outermost `nn.Module` call (global forward hooks, call depth tracked so inner modules do not count).
After MEMFIT_PROBE_STEPS steps every rank writes its result and ends the process with exit code 0.

Monitoring a training pod (MEMFIT_PROBE_MONITOR=1, memfit_trainer.probe.monitor) the process runs to its own
end: the first MEMFIT_PROBE_STEPS steps are kept and checked against MEMFIT_PROBE_BUDGET_BYTES (the plan's
prediction plus headroom; a peak above it ends the process with MemoryOverPlan's exit code before an
out-of-memory, as memfit's trainer does), and every step after them only counts (steps, seconds, largest
peak), read (a CUDA synchronize) and written at most once a second.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from memfit.api import pod as contract
from memfit.api.termination import EXIT_MEMORY_OVER_PLAN
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

from memfit_trainer.probe import report
from memfit_trainer.probe.env import (
    DEFAULT_PROBE_STEPS,
    ENV_PROBE_BUDGET_BYTES,
    ENV_PROBE_MONITOR,
    ENV_PROBE_OUT,
    ENV_PROBE_STEPS,
    rank_result_path,
)
from memfit_trainer.probe.readers import StepReader, reader_for
from memfit_trainer.probe.records import (
    ENDED_AT_EXIT,
    ENDED_AT_STEPS,
    OVER_PLAN,
    RUNNING,
    ProbeResult,
    StepRecord,
    write_atomic,
)
from memfit_trainer.probe.report import EVAL_LOSS, LOSS

DEEPSPEED_ENGINE_MODULE = "deepspeed.runtime.engine"
HF_TRAINER_MODULE = "transformers.trainer"
MONITOR_WRITE_SECONDS = 1.0  # a monitored process writes its counts at most this often after the first steps


def leading_dimension(values: Iterable[Any]) -> int | None:
    """The first dimension of the first tensor among `values` (None without a tensor of rank >= 1)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            return int(value.shape[0]) if value.dim() > 0 else None
    return None


def in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread: module calls there are activation
    checkpointing's recomputation (torch.utils.checkpoint, reentrant or not, on the thread that called
    backward), not the script's calls. Reading memory or ending the process there read half a backward
    and hung HF Trainer scripts with gradient checkpointing."""
    return bool(torch._C._current_graph_task_id() != -1)


class Probe:
    """The probe's state in one process: step records, module call depth, optimizer step depth."""

    def __init__(self, *, out: Path, steps_wanted: int, rank: int, reader: StepReader,
                 exit_process: Callable[[int], None] = os._exit, monitor: bool = False,
                 budget_bytes: int | None = None, inject_factor: float = 1.0) -> None:  # fmt: skip
        self.out = out
        self.steps_wanted = steps_wanted
        self.rank = rank
        self.reader = reader
        self.exit_process = exit_process
        self.monitor = monitor  # a training pod's process: runs to its end (the module docstring)
        self.budget_bytes = budget_bytes if monitor else None
        self.inject_factor = inject_factor  # tests and drills: the measured peak times this (first_steps.py)
        self.records: list[StepRecord] = []
        self.steps_read = 0
        self.seconds_sum = 0.0
        self.max_peak = 0
        self.max_reserved: int | None = None
        self.over_plan_bytes: int | None = None
        self.losses: dict[str, float] = {}  # the script's latest loss and eval loss (memfit_trainer.probe.report)
        self._patched_trainer: type | None = None
        self._last_write = 0.0
        self.forward_calls = 0
        self.steps_ended = 0
        self.optimizer_steps = 0
        self.finished = False  # the final result is written
        self._module_depth = 0
        self._step_depth = 0
        self._fed: int | None = None
        self._first_call_of_step = True
        self._deepspeed = False  # the script steps a DeepSpeed engine: its step is the training step
        self._patched_engine: type | None = None
        self._last_step_end = time.perf_counter()
        self._ended_at: float | None = None  # a step ended at this time; its reading is pending

    # --- nn.Module calls ----------------------------------------------------------------------------

    def on_module_call(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if in_backward():
            return
        if self._module_depth == 0:
            self.settle()
            self.forward_calls += 1
            self.patch_deepspeed()
            self.patch_hf_trainer()
            if self._first_call_of_step:
                self._fed = leading_dimension(args)
        self._module_depth += 1

    def on_module_return(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                         output: Any) -> None:  # fmt: skip
        if in_backward():
            return
        self._module_depth = max(0, self._module_depth - 1)
        if self._module_depth == 0 and self._first_call_of_step:
            if self._fed is None:  # called with keyword arguments only (model(**batch))
                self._fed = leading_dimension(kwargs.values())
            self._first_call_of_step = False

    # --- optimizer steps ----------------------------------------------------------------------------

    def on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._step_depth += 1

    def on_optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1
        self._step_depth = max(0, self._step_depth - 1)
        if self._step_depth == 0 and not self._deepspeed:
            self.end_step()

    def patch_deepspeed(self) -> None:
        """Wrap DeepSpeedEngine.step once DeepSpeed is imported (checked at each outermost module call)."""
        engine_module = sys.modules.get(DEEPSPEED_ENGINE_MODULE)
        engine_class = getattr(engine_module, "DeepSpeedEngine", None)
        if engine_class is None or engine_class is self._patched_engine:
            return
        original = engine_class.step
        probe = self

        @functools.wraps(original)
        def step(engine: Any, *args: Any, **kwargs: Any) -> Any:
            probe._deepspeed = True
            before = getattr(engine, "global_steps", None)
            probe._step_depth += 1
            try:
                out = original(engine, *args, **kwargs)
            finally:
                probe._step_depth = max(0, probe._step_depth - 1)
            if probe._step_depth == 0 and getattr(engine, "global_steps", None) != before:
                probe.end_step()
            return out

        engine_class.step = step
        self._patched_engine = engine_class

    def patch_hf_trainer(self) -> None:
        """Read the losses the Hugging Face Trainer logs (`Trainer.log`, which its subclasses call), once
        transformers' trainer is imported (checked at each outermost module call)."""
        trainer_class = getattr(sys.modules.get(HF_TRAINER_MODULE), "Trainer", None)
        if trainer_class is None or trainer_class is self._patched_trainer:
            return
        original = trainer_class.log
        probe = self

        @functools.wraps(original)
        def log(trainer: Any, logs: dict[str, float], *args: Any, **kwargs: Any) -> Any:
            for key in (LOSS, EVAL_LOSS):
                if isinstance(logs.get(key), int | float):
                    probe.report(key, float(logs[key]))
            return original(trainer, logs, *args, **kwargs)

        trainer_class.log = log
        self._patched_trainer = trainer_class

    def report(self, series: str, value: float) -> None:
        """A loss the script reported (memfit_trainer.probe.report): served with the next write."""
        if value == value and abs(value) != float("inf"):  # NaN or infinite: not shown
            self.losses[series] = value

    # --- readings and the result --------------------------------------------------------------------

    def end_step(self) -> None:
        """One training step ended: its reading is taken at the next safe point (`settle`)."""
        self._ended_at = time.perf_counter()
        self.steps_ended += 1
        if self.steps_ended < self.steps_wanted and not self.monitor:
            self.write(RUNNING)  # what a process that hangs before its next step leaves behind

    def settle(self) -> None:
        """Read the ended step's memory; after the last wanted step, write and end the process."""
        if self._ended_at is None:
            return
        seconds, self._ended_at = self._ended_at - self._last_step_end, None
        if self.monitor and self.steps_read >= self.steps_wanted and not self._due():
            # Past the first steps a reading (a CUDA synchronize) is taken at most once a second: the
            # allocator's peak since the last one covers the steps in between.
            self.steps_read += 1
            self.seconds_sum += seconds
            self._fed = None
            self._first_call_of_step = True
            self._last_step_end = time.perf_counter()
            return
        memory = self.reader.read()
        self.steps_read += 1
        record = StepRecord(
            step=self.steps_read,
            peak_bytes=memory.peak_bytes,
            step_seconds=round(seconds, 6),
            micro_batch=self._fed,
            reserved_peak_bytes=memory.reserved_peak_bytes,
        )
        self.seconds_sum += seconds
        self.max_peak = max(self.max_peak, memory.peak_bytes)
        if memory.reserved_peak_bytes is not None:
            self.max_reserved = max(self.max_reserved or 0, memory.reserved_peak_bytes)
        self._fed = None
        self._first_call_of_step = True
        self._last_step_end = time.perf_counter()  # the reading's own time belongs to no step
        if self.monitor:
            self.monitored(record)
            return
        self.records.append(record)
        if len(self.records) < self.steps_wanted:
            self.write(RUNNING)
            return
        self.write(ENDED_AT_STEPS)
        sys.stdout.flush()
        sys.stderr.flush()
        self.exit_process(0)

    def _due(self) -> bool:
        """A monitored process's counts are due to be read and written (once a second after the first steps)."""
        return time.monotonic() - self._last_write >= MONITOR_WRITE_SECONDS

    def monitored(self, record: StepRecord) -> None:
        """A training pod's step: the first ones are kept and checked against the plan, every one counted."""
        if self.steps_read <= self.steps_wanted:
            self.records.append(record)
            if self.budget_bytes is not None and self.measured(record) > self.budget_bytes:
                self.over_plan_bytes = self.measured(record)
                self.write(OVER_PLAN)
                sys.stdout.flush()
                sys.stderr.flush()
                self.exit_process(EXIT_MEMORY_OVER_PLAN)
                return
        self.write(RUNNING)  # a first step, or a reading that was due

    def measured(self, record: StepRecord) -> int:
        """What the first-steps check compares with the plan: the device's view (the allocator's reservation
        on a GPU), times the injected factor of tests and drills."""
        return int(max(record.peak_bytes, record.reserved_peak_bytes or 0) * self.inject_factor)

    def result(self, ended: str) -> ProbeResult:
        return ProbeResult(rank=self.rank, device=self.reader.device, memory_meter=self.reader.meter_name,
                           steps_wanted=self.steps_wanted, ended=ended, forward_calls=self.forward_calls,
                           steps=tuple(self.records), steps_ended=self.steps_ended,
                           optimizer_steps=self.optimizer_steps, steps_read=self.steps_read,
                           step_seconds_sum=round(self.seconds_sum, 6), max_peak_bytes=self.max_peak,
                           max_reserved_peak_bytes=self.max_reserved, budget_bytes=self.budget_bytes,
                           over_plan_bytes=self.over_plan_bytes, loss=self.losses.get(LOSS),
                           eval_loss=self.losses.get(EVAL_LOSS))  # fmt: skip

    def write(self, ended: str) -> None:
        write_atomic(rank_result_path(self.out, self.rank), self.result(ended).to_json())
        self._last_write = time.monotonic()
        self.finished = ended not in (RUNNING,)

    def write_at_exit(self) -> None:
        """The script ended before the last wanted step: the result so far, when it trained at all (a
        launcher such as torchrun, which runs no model, writes nothing). Then stop the meter."""
        try:
            self._last_write = float("-inf")  # the last steps' reading is due now (a monitored process)
            self.settle()
            if not self.finished and (self.records or self.forward_calls):
                self.write(ENDED_AT_EXIT)
        finally:
            self.reader.close()


def install(probe: Probe) -> None:
    """Register the probe's global module and optimizer hooks and its exit handler."""
    torch_module.register_module_forward_pre_hook(probe.on_module_call)
    torch_module.register_module_forward_hook(probe.on_module_return, with_kwargs=True, always_call=True)
    torch_optimizer.register_optimizer_step_pre_hook(probe.on_optimizer_step)
    torch_optimizer.register_optimizer_step_post_hook(probe.on_optimizer_stepped)
    atexit.register(probe.write_at_exit)
    report.install(probe.report)


def install_from_env(environ: Mapping[str, str]) -> Probe | None:
    """The probe MEMFIT_PROBE_OUT asks for, installed; None when the variable is unset."""
    out = environ.get(ENV_PROBE_OUT, "").strip()
    if not out:
        return None
    steps = int(environ.get(ENV_PROBE_STEPS, "") or DEFAULT_PROBE_STEPS)
    rank = int(environ.get("RANK", "0") or 0)  # torchrun's rank of this process
    budget = environ.get(ENV_PROBE_BUDGET_BYTES, "").strip()
    try:
        factor = max(0.0, float(environ.get(contract.ENV_INJECT_PEAK_FACTOR, "") or 1.0))
    except ValueError:
        factor = 1.0
    probe = Probe(out=Path(out), steps_wanted=max(1, steps), rank=rank, reader=reader_for(environ),
                  monitor=environ.get(ENV_PROBE_MONITOR) == "1", budget_bytes=int(budget) if budget.isdigit() else None,
                  inject_factor=factor)  # fmt: skip
    install(probe)
    return probe

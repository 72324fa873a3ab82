"""Measure the peak memory and step time of each profile configuration in one process.

The model is built once inside the memory meter's session (so that the CPU counter includes it) and
reused: configurations are grouped by optimizer state (32- or 8-bit), the state is materialised once
per group, and every measured step after that is a steady-state step (step 2+ of a real run).

The configurations run on the bare model, as the trainer runs a `ddp` plan at world size 1 (no DDP
wrapper); with `ddp` the model is wrapped in DistributedDataParallel on a one-rank process group.
Before anything is measured one unmeasured probe step checks that every trainable parameter gets a
gradient: under elided arithmetic a data-dependent model (a top-k router fed garbage) can starve
some parameters, and the profile must then be rerun with real arithmetic (`ElisionUnsafe`).

Activation curves (`curves`): for each (precision, checkpointing) the forward+backward peak above
the bytes allocated at the step's start, at micro-batches 1, 2, 4, ... (up to `curve_max_micro_batch`
or `curve_budget_bytes`), once on the bare model (backward creates the gradients) and once under DDP
with `gradient_as_bucket_view=True` (the gradients are the reducer's buckets, allocated before
forward: world size 2+, or accumulation). Calibration fits per-sample and fixed terms from them
(memfit.memory.curves), whatever the model is. Bytes saved for backward per sample are measured with
`torch.autograd.graph.saved_tensors_hooks` (unique storages) and bound how far the curves go.

With `split_optimizer` (the default with elided compute) the optimizer step, whose memory does not depend on precision,
checkpointing or micro-batch under autocast (fp32 weights, fp32 gradients), is measured once per
group; each configuration then runs forward and backward only, and its peak is
`max(forward/backward peak, bytes at the end of backward + the optimizer step's own transient peak)`:
the phases of a step are sequential, so this is the step's peak, measured in two parts. On a 2-core
CPU it saves about two thirds of every GPT-2-small step (AdamW over 163M parameters in one thread).
Without it, each step marks its forward+backward and its optimizer step as sub-regions. Either way a
result carries both phase peaks (`backward_peak_bytes`, `step_peak_bytes`): calibration fits the
activations from the first and the optimizer's extra bytes from the second.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from memfit.api.common import Checkpointing, Precision
from memfit.api.job import OptimizerKind
from torch.utils.flop_counter import FlopCounterMode

from memfit_trainer.meters import RegionMemory, RegionMeter, region_meter
from memfit_trainer.problems import TrainingProblem
from memfit_trainer.profiler.configs import ProfileConfig
from memfit_trainer.profiler.elide import ElideCompute
from memfit_trainer.profiler.harness import (
    activation_checkpointing,
    autocast,
    batch_for,
    make_optimizer,
    materialise_optimizer_state,
    train_step,
)
from memfit_trainer.profiler.timing import GemmRates


@dataclass(frozen=True, slots=True)
class MeasureOptions:
    """How to run the measured steps."""

    device: torch.device
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    steps_per_config: int = 1
    elide: bool = False
    elide_memory_bound: bool = False
    split_optimizer: bool = False
    ddp: bool = False
    warmup_passes: int = 2
    curves: tuple[tuple[Precision, Checkpointing], ...] = ()
    curve_max_micro_batch: int = 32
    curve_budget_bytes: int = 4 << 30  # largest activation bytes a curve point may allocate


# An elided forward may save this share more or fewer bytes for backward than a real one.
ELIDED_SAVED_TOLERANCE = 0.01


class ModelStepError(RuntimeError):
    """The problem's model raised in a plain forward + backward (user code: fix the spec)."""


class ElisionUnsafe(RuntimeError):
    """Elided arithmetic changed what the model allocates (data-dependent control flow)."""


@dataclass(frozen=True, slots=True)
class ConfigResult:
    """Peaks and step time of one configuration (or why it could not run)."""

    config: ProfileConfig
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int | None = None
    peak_device_bytes: int | None = None
    step_seconds: float = 0.0
    regions: tuple[RegionMemory, ...] = ()
    error: str | None = None
    backward_peak_bytes: int | None = None  # forward + backward (optimizer measured separately)
    step_peak_bytes: int | None = None  # the optimizer step on top of what backward left
    refused: bool = False  # the device could not run it (not out of memory): `error` says what raised


@dataclass(slots=True)
class _Pending:
    names: list[str] = field(default_factory=list)
    extra_seconds: list[float] = field(default_factory=list)
    optimizer_region: str | None = None
    optimizer_extra_seconds: float = 0.0
    error: str | None = None
    refused: bool = False


@dataclass(frozen=True, slots=True)
class CurveResult:
    """One activation curve: micro-batches and the forward+backward peak above the step's start."""

    precision: Precision
    checkpointing: Checkpointing
    gradients_held: bool
    micro_batch_sizes: tuple[int, ...]
    peak_bytes: tuple[int, ...]
    saved_bytes_per_sample: int | None


@dataclass(slots=True)
class MeasureRun:
    """Everything one measuring session produced."""

    problem: TrainingProblem | None = None
    results: list[ConfigResult] = field(default_factory=list)
    flops_per_sample: float = 0.0
    model_bytes: int = 0
    curves: list[CurveResult] = field(default_factory=list)
    unused_parameters: tuple[str, ...] = ()  # trainable parameters the probe step left without a gradient
    # (precision, checkpointing, held) -> ([(micro-batch, region)], saved bytes per sample)
    curve_regions: dict[tuple[Precision, Checkpointing, bool], tuple[list[tuple[int, str]], int | None]] = field(
        default_factory=dict
    )
    # Curve groups the device could not run: (precision, checkpointing, what raised).
    curve_refusals: list[tuple[Precision, Checkpointing, str]] = field(default_factory=list)


def measure_configs(
    build: Callable[[], TrainingProblem],
    configs: tuple[ProfileConfig, ...],
    options: MeasureOptions,
    *,
    on_built: Callable[[TrainingProblem], None] | None = None,
) -> MeasureRun:
    """Build the problem inside the meter's session and measure every configuration."""
    run = MeasureRun()
    meter = region_meter(options.device)
    elide = ElideCompute(memory_bound=options.elide_memory_bound) if options.elide else None
    pending: dict[ProfileConfig, _Pending] = {}
    with meter, elide if elide is not None else contextlib.nullcontext():
        problem = build()
        problem.model.to(options.device)
        problem.model.train()
        run.problem = problem
        run.model_bytes = sum(p.numel() * p.element_size() for p in problem.model.parameters())
        if on_built is not None:
            on_built(problem)
        rates = _gemm_rates(problem, configs, options.device) if elide is not None else None
        model = _wrap_ddp(problem.model, options.device) if options.ddp else problem.model
        session = _Session(problem, model, options, meter, elide, rates, run, pending)
        session.probe(configs[0])
        try:
            for eight_bit in (False, True):
                group = [c for c in configs if c.optimizer8bit == eight_bit]
                if group:
                    session.measure_group(group)
            if options.curves:
                # Last: the one-rank DDP wrapper's buckets may outlive it, and the curves are relative.
                session.measure_curves()
        except (torch.OutOfMemoryError, MemoryError, ElisionUnsafe):
            raise
        except Exception as exc:
            if elide is None:
                raise
            # The probe passed at one micro-batch; a larger one (or a checkpointed or held-gradient
            # pass) failed under elided arithmetic: no elided number can be trusted, rerun for real.
            raise ElisionUnsafe(f"a measured step with elided arithmetic raised {type(exc).__name__}: {exc}") from exc
    results = meter.results()
    run.results = [_result(c, pending.get(c), results) for c in configs]
    run.curves = [_curve(key, points, saved, results) for key, (points, saved) in run.curve_regions.items()]
    return run


def _curve(
    key: tuple[Precision, Checkpointing, bool], points: list[tuple[int, str]], saved: int | None,
    results: dict[str, RegionMemory],
) -> CurveResult:
    precision, ckpt, held = key
    measured = [(b, results[n]) for b, n in points if n in results]
    return CurveResult(
        precision, ckpt, held,
        tuple(b for b, _ in measured),
        tuple(r.peak_allocated_bytes - r.start_allocated_bytes for _, r in measured),
        saved,
    )


def _result(
    config: ProfileConfig, pending: _Pending | None, results: dict[str, RegionMemory]
) -> ConfigResult:
    if pending is None:
        return ConfigResult(config, error="not run")
    steps = [results[n] for n in pending.names if n in results]
    if pending.error is not None or not steps:
        return ConfigResult(config, error=pending.error or "no step completed", refused=pending.refused)
    seconds = [s.seconds + extra for s, extra in zip(steps, pending.extra_seconds, strict=True)]
    peak = max(s.peak_allocated_bytes for s in steps)
    opt = results.get(pending.optimizer_region) if pending.optimizer_region else None
    regions = tuple(steps)
    backward_peak = step_peak = None
    phases = [(results.get(f"{n}:backward"), results.get(f"{n}:step")) for n in pending.names]
    if phases and all(b is not None and o is not None for b, o in phases):
        backward_peak = max(b.peak_allocated_bytes for b, _ in phases if b is not None)
        step_peak = max(o.peak_allocated_bytes for _, o in phases if o is not None)
    if opt is not None:
        # Sequential phases: the optimizer step runs on top of what backward left allocated.
        transient = opt.peak_allocated_bytes - opt.start_allocated_bytes
        backward_peak = peak
        step_peak = max(s.end_allocated_bytes for s in steps) + transient
        peak = max(peak, step_peak)
        seconds = [s + opt.seconds + pending.optimizer_extra_seconds for s in seconds]
        regions = (*regions, opt)
    # The first step of a configuration pays one-time costs (kernel selection, autotuning).
    timed = seconds[1:] or seconds
    return ConfigResult(
        config,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=_max_or_none([s.peak_reserved_bytes for s in regions]),
        peak_device_bytes=_max_or_none([s.peak_device_bytes for s in regions]),
        step_seconds=sum(timed) / len(timed),
        regions=regions,
        backward_peak_bytes=backward_peak,
        step_peak_bytes=step_peak,
    )


def _max_or_none(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP on the existing process group, or on a one-rank group created here (as the trainer does)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from memfit_trainer import dist as mdist

    if not dist.is_initialized():
        mdist.init_distributed(mdist.read_dist_env(os.environ), device)
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


@dataclass(slots=True)
class _Session:
    problem: TrainingProblem
    model: torch.nn.Module
    options: MeasureOptions
    meter: RegionMeter
    elide: ElideCompute | None
    rates: GemmRates | None
    run: MeasureRun
    pending: dict[ProfileConfig, _Pending]
    warmed: bool = False
    held_model: torch.nn.Module | None = None  # DDP with gradient bucket views, built for the curves

    def probe(self, config: ProfileConfig) -> None:
        """One unmeasured forward/backward: which trainable parameters get no gradient.

        Under elided arithmetic a parameter without a gradient means the values steered the model
        (routing, early exit) and the measured allocations cannot be trusted: ElisionUnsafe.
        """
        model = self.problem.model
        if self.elide is not None:
            self.elide.track(True)
        try:
            batch = batch_for(self.problem, micro_batch_size=max(2, config.micro_batch_size), step=0,
                              device=self.options.device)
            with autocast(config.precision, self.options.device):
                loss = self.problem.loss_fn(self.model, batch)
            loss.backward()
            del loss, batch
        except (torch.OutOfMemoryError, MemoryError):
            raise
        except Exception as exc:
            if self.elide is not None:
                raise ElisionUnsafe(f"a step with elided arithmetic raised {type(exc).__name__}: {exc}") from exc
            raise ModelStepError(f"the model cannot run a training step (forward + backward, "
                                 f"{config.precision.value}): {type(exc).__name__}: {exc}") from exc
        finally:
            data_dependent = self.elide.data_dependent if self.elide is not None else None
            if self.elide is not None:
                self.elide.track(False)
        if data_dependent is not None:
            raise ElisionUnsafe(f"{data_dependent} read elided values (data-dependent control flow)")
        unused = tuple(n for n, p in model.named_parameters() if p.requires_grad and p.grad is None)
        for p in model.parameters():
            p.grad = None
        _release(self.options.device)
        if unused and self.elide is not None:
            raise ElisionUnsafe(f"{len(unused)} trainable parameters got no gradient with elided arithmetic "
                                f"(data-dependent model), e.g. {unused[0]}")
        self.run.unused_parameters = unused

    def _check_elided_forward(self) -> None:
        """User code: the bytes an elided forward saves for backward must be those of a real one.

        Kernels whose meta function allocates differently from the real one (an LSTM's fused CPU
        kernel keeps a workspace its meta twin does not) would make every elided curve wrong.
        One real forward at micro-batch 2 against an elided one decides (1 % tolerance).
        """
        from torch.utils._python_dispatch import _disable_current_modes

        elided = self._saved_bytes(Precision.FP32, 2)
        with _disable_current_modes():
            real = self._saved_bytes(Precision.FP32, 2)
        _release(self.options.device)
        if abs(elided - real) > ELIDED_SAVED_TOLERANCE * max(real, 1):
            raise ElisionUnsafe(f"an elided forward saves {elided:,} bytes for backward, a real one {real:,}")

    def measure_curves(self) -> None:
        """The activation curves (forward+backward only: no optimizer state is needed).

        With elided arithmetic the saved-bytes check runs first; it comes after the configurations
        because its forwards leave allocations behind that would shift their absolute peaks.
        """
        if self.elide is not None:
            self._check_elided_forward()
        self._measure_curves()

    def _held(self) -> torch.nn.Module:
        if self.held_model is None:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            from memfit_trainer import dist as mdist

            device = self.options.device
            if not dist.is_initialized():
                mdist.init_distributed(mdist.read_dist_env(os.environ), device)
            self.held_model = DistributedDataParallel(
                self.problem.model, device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=True, find_unused_parameters=bool(self.run.unused_parameters),
            )
        return self.held_model

    def _saved_bytes(self, precision: Precision, micro_batch_size: int) -> int:
        """Bytes autograd saves for backward in one forward (unique storages), graph then dropped."""
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            try:
                storage = t.untyped_storage()
                storages[storage.data_ptr() or id(storage)] = storage.nbytes()
            except (RuntimeError, NotImplementedError):
                pass
            return t

        batch = batch_for(self.problem, micro_batch_size=micro_batch_size, step=0, device=self.options.device)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision, self.options.device):
            loss = self.problem.loss_fn(self.problem.model, batch)
        del loss, batch
        params = {p.untyped_storage().data_ptr() for p in self.problem.model.parameters()}
        return sum(n for ptr, n in storages.items() if ptr not in params)

    def _measure_curves(self) -> None:
        for precision, ckpt in self.options.curves:
            try:
                self._measure_curve_group(precision, ckpt)
            except (torch.OutOfMemoryError, MemoryError):
                raise
            except Exception as exc:
                if self.elide is not None:
                    raise
                # This precision or checkpointing cannot run here: its curves are skipped and recorded
                # (a prediction for it then rests on the analytic terms, and says so); the others stand.
                for held in (False, True):
                    self.run.curve_regions.pop((precision, ckpt, held), None)
                self.run.curve_refusals.append((precision, ckpt, refusal(exc)))
                for p in self.problem.model.parameters():
                    p.grad = None
        # The reducer's buckets must not stay allocated under later measurements.
        self.held_model = None
        _release(self.options.device)

    def _measure_curve_group(self, precision: Precision, ckpt: Checkpointing) -> None:
        options = self.options
        with activation_checkpointing(self.problem, ckpt):
            try:
                saved = max(0, self._saved_bytes(precision, 2) - self._saved_bytes(precision, 1))
            except Exception:  # hooks unsupported by some custom function: curves still run
                saved = None
            for held in (False, True):
                model = self._held() if held else self.problem.model
                if held:  # DDP rebuilds its buckets after the first pass
                    for _ in range(self.options.warmup_passes):
                        self._fwd_bwd(model, precision, 1)
                points: list[tuple[int, str]] = []
                b = 1
                while b <= options.curve_max_micro_batch:
                    if points and saved and b * saved > options.curve_budget_bytes:
                        break
                    name = f"curve:{precision.value}:{ckpt.value}:{'held' if held else 'bare'}:{b}"
                    try:
                        with self.meter.region(name):
                            self._fwd_bwd(model, precision, b)
                    except (torch.OutOfMemoryError, MemoryError):
                        break
                    except RuntimeError as exc:
                        if "can't allocate memory" not in str(exc):
                            raise
                        break
                    finally:
                        for p in self.problem.model.parameters():
                            p.grad = None
                        _release(options.device)
                    points.append((b, name))
                    b *= 2
                # The saved bytes do not depend on the wrapper: reported once (the 4 KiB Profile).
                self.run.curve_regions[(precision, ckpt, held)] = (points, None if held else saved)

    def _fwd_bwd(self, model: torch.nn.Module, precision: Precision, micro_batch_size: int) -> None:
        batch = batch_for(self.problem, micro_batch_size=micro_batch_size, step=0, device=self.options.device)
        with autocast(precision, self.options.device):
            loss = self.problem.loss_fn(model, batch)
        loss.backward()
        del loss, batch

    def _warm_up(self, config: ProfileConfig, optimizer: torch.optim.Optimizer) -> None:
        """Unmeasured forward/backward passes: DDP rebuilds its buckets after the first one."""
        self.warmed = True
        if not self.options.ddp:
            return
        for step in range(self.options.warmup_passes):
            self._step(config, optimizer, step, with_optimizer=False)
            optimizer.zero_grad(set_to_none=True)

    def measure_group(self, group: list[ProfileConfig]) -> None:
        eight_bit = group[0].optimizer8bit
        try:
            optimizer = make_optimizer(self.problem.model, self.options.optimizer, eight_bit=eight_bit)
        except Exception as exc:  # e.g. bitsandbytes missing: these configurations fail, the others run
            for config in group:
                self.pending[config] = _Pending(error=f"optimizer: {type(exc).__name__}: {exc}")
            return
        materialise_optimizer_state(self.problem.model, optimizer)
        if not self.warmed:
            self._warm_up(group[0], optimizer)
        opt_region, opt_extra = None, 0.0
        if self.options.split_optimizer:
            opt_region, opt_extra = self._measure_optimizer_step(optimizer, eight_bit)
        for config in group:
            self.pending[config] = self._measure_config(config, optimizer, opt_region)
            self.pending[config].optimizer_extra_seconds = opt_extra
        del optimizer
        _release(self.options.device)

    def _measure_optimizer_step(self, optimizer: torch.optim.Optimizer, eight_bit: bool) -> tuple[str, float]:
        """The optimizer step's own peak, on top of resident gradients; (region, modelled extra seconds)."""
        for p in self.problem.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        name = f"optimizer:{'8bit' if eight_bit else '32bit'}"
        if self.elide is not None:
            self.elide.take_flops()
        with self.meter.region(name):
            optimizer.step()
        extra = self.rates.seconds(self.elide.take_flops()) if self.elide is not None and self.rates else 0.0
        optimizer.zero_grad(set_to_none=True)
        return name, extra

    def _measure_config(
        self, config: ProfileConfig, optimizer: torch.optim.Optimizer, opt_region: str | None
    ) -> _Pending:
        if config.precision == Precision.FP16:
            opt_region = None  # the GradScaler's unscale and skip logic need the whole step
        out = _Pending(optimizer_region=opt_region)
        count = self.run.flops_per_sample == 0.0 and config.checkpointing == Checkpointing.NONE
        try:
            with activation_checkpointing(self.problem, config.checkpointing):
                for step in range(self.options.steps_per_config):
                    name = f"{len(self.pending):02d}:{config.key}:step{step}"
                    if self.elide is not None:
                        self.elide.take_flops()
                    counter = FlopCounterMode(display=False) if count and step == 0 else None
                    with self.meter.region(name), counter or contextlib.nullcontext():
                        self._step(config, optimizer, step, with_optimizer=opt_region is None, region=name)
                    if counter is not None:
                        self.run.flops_per_sample = counter.get_total_flops() / config.micro_batch_size
                    out.names.append(name)
                    if self.elide is not None and self.rates is not None:
                        out.extra_seconds.append(self.rates.seconds(self.elide.take_flops()))
                    else:
                        out.extra_seconds.append(0.0)
                    optimizer.zero_grad(set_to_none=True)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            out.error = f"out of memory: {str(exc).splitlines()[0][:200]}"
        except Exception as exc:
            if "can't allocate memory" in str(exc):
                out.error = f"out of memory: {str(exc).splitlines()[0][:200]}"
            elif self.elide is not None:
                raise  # elided arithmetic is suspect first: the whole profile reruns for real
            else:
                # The probe step ran, so the model trains; this precision or checkpointing does not on
                # this device (a kernel without bf16, a float32-only extension): skipped, recorded.
                out.error, out.refused = refusal(exc), True
        finally:
            optimizer.zero_grad(set_to_none=True)
            _release(self.options.device)
        return out

    def _step(
        self, config: ProfileConfig, optimizer: torch.optim.Optimizer, step: int, *, with_optimizer: bool,
        region: str | None = None,
    ) -> None:
        device = self.options.device
        if with_optimizer:
            meter = self.meter
            phase = None if region is None else (lambda name: meter.region(f"{region}:{name}"))
            scaler = torch.amp.GradScaler(device.type) if config.precision == Precision.FP16 else None
            train_step(
                self.problem,
                optimizer,
                precision=config.precision,
                micro_batch_size=config.micro_batch_size,
                step=step,
                device=device,
                scaler=scaler,
                model=self.model,
                phase=phase,
            )
            return
        batch = batch_for(self.problem, micro_batch_size=config.micro_batch_size, step=step, device=device)
        with autocast(config.precision, device):
            loss = self.problem.loss_fn(self.model, batch)
        loss.backward()
        del loss, batch


def _gemm_rates(
    problem: TrainingProblem, configs: tuple[ProfileConfig, ...], device: torch.device
) -> GemmRates:
    linears = [m for m in problem.model.modules() if isinstance(m, torch.nn.Linear)]
    inner = max((m.in_features for m in linears), default=256)
    cols = max((m.out_features for m in linears if m.out_features <= 8 * inner), default=inner)
    rows = problem.tokens_per_sample * min(c.micro_batch_size for c in configs)
    return GemmRates(rows=rows, inner=inner, cols=cols, device=device)


def refusal(exc: BaseException) -> str:
    """What a step the device refused raised, in one short line (the Profile keeps 120 characters)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:120]


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

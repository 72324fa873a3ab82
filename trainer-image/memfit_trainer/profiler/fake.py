"""Zero-GPU analysis: PyTorch's MemTracker / FSDPMemTracker on a fake model (FakeTensorMode).

For configurations the profiling device cannot run (micro-batches too large for it, FSDP at world
sizes it does not have): the model is built under FakeTensorMode on the CPU (no real memory, no
arithmetic), trained for two steps, and the tracker's peak of live tensor bytes after the first step
is returned. FSDP runs on a fake process group (`FakeStore`) of any world size in one process; the
device mesh is created outside FakeTensorMode (inside it fails with DataDependentOutputException).
A fake `cuda` device cannot train on a CPU-only machine, so everything is traced on a fake `cpu`.

What the trackers do not see (shared/reference/memory-model.md §6): CUDA context, cuBLAS workspace,
NCCL buffers, allocator rounding and fragmentation, DDP's gradient buckets (DDP cannot run on fake
tensors, so the model is traced bare), and allocations inside kernels. The accuracy benchmark uses
these functions as the MemTracker peers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from memfit.api.common import Checkpointing, Precision
from memfit.api.job import OptimizerKind
from memfit.api.problem import Problem

from memfit_trainer.problems import BatchKey, TrainingProblem, build_problem
from memfit_trainer.profiler.harness import activation_checkpointing, autocast, make_optimizer

TRACED_STEPS = 2  # step 1 allocates the optimizer state; the peak is taken over step 2


@dataclass(frozen=True, slots=True)
class FakeConfig:
    """What to trace: the single-process or FSDP configuration."""

    precision: Precision = Precision.FP32
    checkpointing: Checkpointing = Checkpointing.NONE
    micro_batch_size: int = 1
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    optimizer8bit: bool = False
    fsdp_world_size: int = 0  # 0: no FSDP (MemTracker); N >= 1: FSDP2 on N fake ranks
    fsdp_reshard_after_forward: bool = True  # FSDP stage 3 (True) or 2 (False)


@dataclass(frozen=True, slots=True)
class FakeEstimate:
    """Peak live tensor bytes per rank, by the tracker's categories, and how long the trace took."""

    peak_bytes: int
    categories: dict[str, int]
    seconds: float


def fake_peak(spec: Problem, config: FakeConfig, *, seed: int = 0) -> FakeEstimate:
    """Trace two training steps of `spec` under FakeTensorMode and return the tracker's peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    batch = _real_batch(spec, config.micro_batch_size, seed)
    # Non-fake inputs are allowed for bitsandbytes' quantisation maps, built for real (see _optimizer).
    with (
        _fake_process_group(config.fsdp_world_size) as mesh,
        FakeTensorMode(allow_non_fake_inputs=True) as mode,
    ):
        problem = build_problem(spec, seed=seed)
        fake_batch = {k: mode.from_tensor(v) for k, v in batch.items()}
        if mesh is not None:
            _shard(problem, mesh, config)
        optimizer = _optimizer(problem, config)
        tracker = _tracker(problem, optimizer, config, fake_batch)
        with tracker, activation_checkpointing(problem, config.checkpointing):
            for step in range(TRACED_STEPS):
                with (
                    autocast(config.precision, torch.device("cpu"))
                    if mesh is None
                    else contextlib.nullcontext()
                ):
                    loss = problem.loss_fn(problem.model, fake_batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step == 0:
                    tracker.reset_mod_stats()
        snapshot = tracker.get_tracker_snapshot("peak")
    device = next(iter(snapshot))
    categories = {str(k): int(v) for k, v in snapshot[device].items()}
    return FakeEstimate(categories.get("Total", 0), categories, time.perf_counter() - started)


def _real_batch(spec: Problem, micro_batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    # The synthetic data generators read values (int(tensor)), which fake tensors cannot: draw the
    # batch for real (it is tiny) and convert it.
    problem = _data_only(spec)
    return dict(problem.make_batch(BatchKey(seed=seed, step=1, sample_start=0, samples=micro_batch_size)))


def _data_only(spec: Problem) -> TrainingProblem:
    """The problem built on the meta device: only its data source is used."""
    with torch.device("meta"):
        return build_problem(spec)


def _optimizer(problem: TrainingProblem, config: FakeConfig) -> Any:
    if config.optimizer8bit:
        # bitsandbytes builds its quantisation map with .tolist(), which fake tensors refuse.
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return _make_optimizer(problem, config)
    return _make_optimizer(problem, config)


def _make_optimizer(problem: TrainingProblem, config: FakeConfig) -> Any:
    if config.fsdp_world_size and config.optimizer8bit:
        from memfit.api.job import TrainingSpec

        from memfit_trainer.optim import LocalShardOptimizer

        return LocalShardOptimizer(problem.model.parameters(), TrainingSpec(optimizer=config.optimizer))
    return make_optimizer(problem.model, config.optimizer, eight_bit=config.optimizer8bit)


def _tracker(problem: TrainingProblem, optimizer: Any, config: FakeConfig, batch: dict[str, Any]) -> Any:
    if config.fsdp_world_size:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(problem.model, optimizer)
        tracker.track_inputs((batch,))
        return tracker
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(problem.model, optimizer)
    return tracker


def _shard(problem: TrainingProblem, mesh: Any, config: FakeConfig) -> None:
    """fully_shard per block and on the root, with the trainer's mixed-precision policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(config.precision)
    policy = (
        MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if dtype
        else MixedPrecisionPolicy()
    )
    settings = {"mesh": mesh, "reshard_after_forward": config.fsdp_reshard_after_forward, "mp_policy": policy}
    for block in problem.blocks:
        fully_shard(block, **settings)
    fully_shard(problem.model, **settings)


@contextlib.contextmanager
def _fake_process_group(world_size: int) -> Iterator[Any]:
    """A fake process group of `world_size` ranks and its 1-D CPU mesh (None for world size 0)."""
    if not world_size:
        yield None
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("fake FSDP analysis needs a process without a process group")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()

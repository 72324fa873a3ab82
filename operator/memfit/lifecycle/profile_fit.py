"""Which model the profiling pod measures, and on which pool: full depth, depth-reduced, or nothing.

The profiler's largest default configuration is fp32 without checkpointing at micro-batch 2, one
GPU, plain DDP (docs/profiler.md). Its analytic peak (memfit.memory, CUDA overheads included) is
compared with each allowed pool's usable GPU memory, cheapest pool first:

- `profiling.depth: auto` profiles the whole model on the cheapest pool where it fits, and
  depth-reduced (1 and 2 of its L blocks, the full model only counted on the meta device) where only
  that fits; `reduced` always reduces; `full` never does (the model may then not fit: ProfilingFailed).
- When not even the 2-block model fits any allowed pool, nothing is profiled: the plan rests on the
  analytic model with a larger headroom (`ANALYTIC_HEADROOM_PERCENT` more; condition
  Profiled=False, reason AnalyticOnly).
- A problem without an analytic shape (an entrypoint, a Hugging Face model without an inline config)
  cannot be sized before it is built: `auto` profiles it at full depth, `reduced` reduces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from memfit.api.job import MemoryOptimizedTrainingJobSpec, ProfilingDepth
from memfit.api.pool import GPUNodePool
from memfit.api.profile import ModelShape
from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.catalog import GpuCatalog
from memfit.memory.predict import memory_terms
from memfit.memory.problems import ShapeError, shape_from_problem
from memfit.memory.shape import Shape
from memfit.memory.strategy import Strategy
from memfit.mig import resolve_slice
from memfit.planner import ANALYTIC_HEADROOM_PERCENT

__all__ = ["ANALYTIC", "ANALYTIC_HEADROOM_PERCENT", "FULL", "REDUCED", "ProfilingChoice", "choose_profiling", "fits"]

FULL, REDUCED, ANALYTIC = "full", "reduced", "analytic"
# The profiler's largest default configuration: fp32, no checkpointing, micro-batch 2 (configs.py).
PROFILE_MICRO_BATCH = 2
# Room left on the profiling GPU above the analytic peak (allocator slack, library workspaces).
PROFILE_HEADROOM = 0.10
# Reduced profiles measure 1 and 2 blocks (memfit_trainer/profiler/depth.py).
REDUCED_BLOCKS = 2
MIB = 1024**2


@dataclass(frozen=True, slots=True)
class ProfilingChoice:
    """Where and how deep to profile; `pool` None with `depth` analytic means nothing is profiled."""

    depth: str  # full | reduced | analytic
    pool: GPUNodePool | None
    reason: str = ""


def usable_bytes(pool: GPUNodePool, catalog: GpuCatalog) -> int | None:
    """The pool's usable bytes per GPU, or per MIG slice (spec, else catalog); None when neither says."""
    gpu = catalog.find(pool.spec.gpu.product)
    if pool.spec.gpu.mig is not None:
        piece = resolve_slice(pool.spec.gpu, gpu)
        return None if isinstance(piece, str) else piece.usable_mib * MIB
    if pool.spec.gpu.memory_mi_b is not None:
        return pool.spec.gpu.memory_mi_b * MIB
    return gpu.usable_mib * MIB if gpu else None


def profiling_peak_bytes(shape: ModelShape, spec: MemoryOptimizedTrainingJobSpec, *, blocks: int | None) -> int:
    """Analytic peak of the profiler's largest configuration on one GPU, for the model with `blocks`
    repeated blocks (None: all of them)."""
    hot = Shape.of(shape)
    if blocks is not None and blocks < hot.layers:
        parameters = hot.parameters - (hot.layers - blocks) * hot.block_parameters
        hot = replace(hot, layers=blocks, parameters=parameters, trainable=min(hot.trainable, parameters),
                      small_trainable=min(hot.small_trainable, parameters))
    config = PLAIN_FP32_DDP.model_copy(update={"micro_batch_size": PROFILE_MICRO_BATCH})
    strategy = Strategy(config=config, optimizer=spec.training.optimizer)
    return int(memory_terms(hot, strategy).peak_bytes(PROFILE_MICRO_BATCH, 1))


def fits(spec: MemoryOptimizedTrainingJobSpec, pool: GPUNodePool, depth: str, catalog: GpuCatalog) -> bool:
    """Whether the profiler's largest configuration at `depth` fits one GPU of `pool` (True when the
    problem has no analytic shape or the pool's memory is unknown: nothing to tell them apart by)."""
    try:
        shape = shape_from_problem(spec.problem)
    except ShapeError:
        return True
    usable = usable_bytes(pool, catalog)
    if usable is None:
        return True
    blocks = REDUCED_BLOCKS if depth == REDUCED else None
    return profiling_peak_bytes(shape, spec, blocks=blocks) * (1 + PROFILE_HEADROOM) <= usable


def choose_profiling(
    spec: MemoryOptimizedTrainingJobSpec, pools: Sequence[GPUNodePool], catalog: GpuCatalog
) -> ProfilingChoice:
    """The depth and the pool (from `pools`, cheapest first) to profile on; see the module docstring."""
    mode = spec.profiling.depth
    try:
        shape: ModelShape | None = shape_from_problem(spec.problem)
    except ShapeError:
        shape = None
    if not pools:
        return ProfilingChoice(REDUCED if mode == ProfilingDepth.REDUCED else FULL, None)
    if shape is None or mode == ProfilingDepth.FULL:
        depth = REDUCED if mode == ProfilingDepth.REDUCED else FULL
        return ProfilingChoice(depth, pools[0])
    reducible = shape.layers > REDUCED_BLOCKS
    full_bytes = profiling_peak_bytes(shape, spec, blocks=None)
    reduced_bytes = profiling_peak_bytes(shape, spec, blocks=REDUCED_BLOCKS) if reducible else full_bytes
    for pool in pools:
        usable = usable_bytes(pool, catalog)
        if usable is None:
            continue
        if (mode == ProfilingDepth.AUTO or not reducible) and full_bytes * (1 + PROFILE_HEADROOM) <= usable:
            return ProfilingChoice(FULL, pool)
        if reducible and reduced_bytes * (1 + PROFILE_HEADROOM) <= usable:
            why = (f"the full model needs {full_bytes / 2**30:.1f} GiB to profile; {REDUCED_BLOCKS} of its "
                   f"{shape.layers} blocks need {reduced_bytes / 2**30:.1f} GiB")
            return ProfilingChoice(REDUCED, pool, why)
    sizes = ", ".join(f"{p.metadata.name} {(usable_bytes(p, catalog) or 0) / 2**30:.1f} GiB" for p in pools)
    smallest = f"{REDUCED_BLOCKS} of its {shape.layers} blocks" if reducible else "the model"
    return ProfilingChoice(ANALYTIC, None, (
        f"not even {smallest} fits one GPU of an allowed pool for profiling "
        f"({reduced_bytes / 2**30:.1f} GiB + {PROFILE_HEADROOM:.0%}; {sizes}): planned from the analytic "
        f"model alone with {ANALYTIC_HEADROOM_PERCENT} percentage points more memory headroom"
    ))

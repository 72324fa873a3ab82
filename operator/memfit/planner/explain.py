"""Plain-words reasons: why a pool was rejected, and the one-line summary of a plan.

Reasons follow the style of Kueue's `Message()` and SkyPilot's errors: what was needed, what the pool
has, and the most memory-frugal configuration that was tried ("l4-spot: needs 27.1 GiB per GPU at
micro-batch 1 even with ZeRO-3 and CPU offload on 8 GPUs; has 22.5 GiB").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from memfit.api.common import Offload
from memfit.api.job import PlanSummary
from memfit.planner.offers import Offer
from memfit.planner.result import PlanResult
from memfit.planner.space import Choice

GIB = 1024**3


def gib(n: float) -> str:
    """Bytes as `27.1 GiB`."""
    return f"{n / GIB:.1f} GiB"


class Lack(StrEnum):
    """Something a configuration needs that a pool may not have."""

    BF16 = "bf16"
    HOST_MEMORY = "host memory"
    NVME = "nvme"
    REFUSED = "refused by the profile's device"


# The pinned fields (path, value) that make a configuration need what a pool lacks, each with what to do
# instead.
LACK_PINS: dict[Lack, tuple[tuple[str, str, str], ...]] = {
    Lack.BF16: (("strategy.precision", "bf16", "pin fp16 or fp32, or leave precision auto"),
                ("strategy.peft.qlora.computeDtype", "bf16", "set computeDtype fp16 or auto")),
    Lack.HOST_MEMORY: (("strategy.offload", "cpu", "give the pool's host.memoryGiB, or pin offload none or "
                        "nvme, or leave it auto"),),
    Lack.NVME: (("strategy.offload", "nvme", "pin offload cpu or none, or leave it auto"),),
    Lack.REFUSED: tuple(("strategy.precision", value, "pin another precision, or leave it auto")
                        for value in ("bf16", "bf16-pure", "fp16", "fp32")),
}
# What the pool lacks, and what to say when no single pin explains the need (the pins together do).
LACK_WORDS: dict[Lack, tuple[str, str, str]] = {
    Lack.BF16: ("{product} has no bf16 (compute capability 8.0+ needed)", "every allowed configuration trains "
                "in bf16", "allow fp16 or fp32"),
    Lack.HOST_MEMORY: ("CPU offload needs host.memoryGiB, which is unknown for this pool,", "every allowed "
                       "configuration offloads to the CPU", "give the pool's host.memoryGiB, or allow offload none"),
    Lack.NVME: ("NVMe offload needs local NVMe; the pool has none (host.nvmeGiB)", "every allowed configuration "
                "offloads to NVMe", "allow offload cpu or none"),
    Lack.REFUSED: ("the profile found that {product} cannot run this job's step in some precisions (the "
                   "profile's skipped list)", "every allowed configuration uses one of them", "allow another "
                   "precision or checkpointing"),
}


def lack_words(lack: Lack, *, product: str, pins: Mapping[str, str]) -> str:
    """Why no allowed configuration runs on a pool that lacks `lack`, naming the pin that asks for it:
    `Tesla-T4 has no bf16 (compute capability 8.0+ needed) and strategy.precision is pinned to bf16: ...`."""
    head, who, fix = LACK_WORDS[lack]
    if (lack == Lack.HOST_MEMORY and pins.get("strategy.activationOffload") == "enabled"
            and pins.get("strategy.offload") != "cpu"):
        return ("activation offload needs host.memoryGiB, which is unknown for this pool, and "
                "strategy.activationOffload is pinned to enabled: give the pool's host.memoryGiB, or set "
                "activationOffload auto or disabled")
    for path, value, pinned_fix in LACK_PINS[lack]:
        if pins.get(path) == value:
            who, fix = f"{path} is pinned to {value}", pinned_fix
            break
    return f"{head.format(product=product)} and {who}: {fix}"


@dataclass(slots=True)
class OfferFailures:
    """What went wrong on one offer while searching it (an accumulator, internal to the planner)."""

    offer: Offer
    # What the pool lacks that every allowed configuration needs (then none of them runs there).
    lacks: tuple[Lack, ...] = ()
    layouts_tried: int = 0
    pinned_micro_batch_layouts: int | None = None
    # (bytes or hours, configuration, world size[, micro-batch]); words are made only for the reason.
    min_memory: tuple[int, Choice, int, int] | None = None
    min_memory_on_gpu: tuple[int, Choice, int, int] | None = None  # the same moving nothing to the host
    min_host: tuple[float, Choice, int] | None = None
    min_nvme: tuple[float, Choice, int] | None = None
    min_deadline: tuple[float, Choice, int] | None = None
    min_price_over: float | None = None
    interrupted_world_size: int | None = None  # fewest GPUs of a run that interruptions never let finish
    extra: list[str] = field(default_factory=list)

    def note_memory(self, peak_bytes: int, choice: Choice, world_size: int, micro_batch: int) -> None:
        entry = (peak_bytes, choice, world_size, micro_batch)
        if self.min_memory is None or peak_bytes < self.min_memory[0]:
            self.min_memory = entry
        moves = choice.config.offload != Offload.NONE or choice.config.activation_offload
        if not moves and (self.min_memory_on_gpu is None or peak_bytes < self.min_memory_on_gpu[0]):
            self.min_memory_on_gpu = entry

    def note_host(self, needed_bytes: float, choice: Choice, world_size: int) -> None:
        if self.min_host is None or needed_bytes < self.min_host[0]:
            self.min_host = (needed_bytes, choice, world_size)

    def note_nvme(self, needed_bytes: float, choice: Choice, world_size: int) -> None:
        if self.min_nvme is None or needed_bytes < self.min_nvme[0]:
            self.min_nvme = (needed_bytes, choice, world_size)

    def note_deadline(self, hours: float, choice: Choice, world_size: int) -> None:
        if self.min_deadline is None or hours < self.min_deadline[0]:
            self.min_deadline = (hours, choice, world_size)

    def note_interruptions(self, world_size: int) -> None:
        if self.interrupted_world_size is None or world_size < self.interrupted_world_size:
            self.interrupted_world_size = world_size

    def note_price(self, price_per_hour: float) -> None:
        if self.min_price_over is None or price_per_hour < self.min_price_over:
            self.min_price_over = price_per_hour

    def reason(self, *, headroom_percent: int, global_batch: int, pinned_micro_batch: int | None,
               max_cost_per_hour: float | None, deadline_hours: float | None,
               pins: Mapping[str, str] | None = None) -> str:
        """Why nothing fits on this offer, most specific cause first: what the job pinned and what the
        pool lacks for every allowed configuration, never a capability some allowed configuration does
        without (`pins`: the job's pinned strategy fields by path, `strategy.precision` -> `bf16`)."""
        offer = self.offer
        parts: list[str] = []
        if self.layouts_tried == 0:
            sizes = sorted({lay.world_size for lay in offer.layouts()})
            parts.append(
                f"training.globalBatchSize {global_batch} is not divisible by any GPU count it offers "
                f"({', '.join(map(str, sizes))})"
            )
        elif self.pinned_micro_batch_layouts == 0:
            parts.append(
                f"the pinned microBatchSize {pinned_micro_batch} does not divide the per-GPU batch "
                f"(globalBatchSize {global_batch} / GPUs) at any GPU count it offers"
            )
        # When offload fits the GPU but not the host, the GPU-memory sentence is about configurations
        # without offload; the host sentence says what offload would need.
        memory = self.min_memory_on_gpu if self.min_host or self.min_nvme else self.min_memory
        if memory is not None:
            peak, choice, world, micro = memory
            words = choice.config.describe(words=True)
            need = peak * (1 + headroom_percent / 100)
            prefix = "without offload it " if memory is not self.min_memory or self.min_host else ""
            parts.append(
                f"{prefix}needs {gib(need)} per GPU ({gib(peak)} predicted + {headroom_percent}% headroom) "
                f"at micro-batch {micro} even with {words} on {world} GPU{'s' if world > 1 else ''}; "
                f"has {gib(offer.usable_bytes)}"
            )
        if self.min_host is not None:
            needed, choice, world = self.min_host
            words = choice.config.describe(words=True)
            parts.append(
                f"{words} on {world} GPU{'s' if world > 1 else ''} would fit the GPU memory but needs "
                f"{gib(needed)} host RAM per node; has {gib(offer.host_usable_bytes_per_node)} usable"
            )
        if self.min_nvme is not None:
            needed, choice, world = self.min_nvme
            words = choice.config.describe(words=True)
            parts.append(
                f"{words} on {world} GPU{'s' if world > 1 else ''} needs {gib(needed)} NVMe per node; "
                f"has {gib(offer.nvme_bytes_per_node)}"
            )
        if self.min_deadline is not None and deadline_hours is not None:
            hours, choice, world = self.min_deadline
            words = choice.config.describe(words=True)
            parts.append(
                f"the fastest fitting configuration ({words} on {world} GPUs) takes {hours:.1f} h, over the "
                f"deadline of {deadline_hours:g} h"
            )
        if self.interrupted_world_size is not None and not parts:
            rate = offer.interruption_rate_per_hour
            parts.append(
                f"no run on it would finish (fastest tried on {self.interrupted_world_size} GPU"
                f"{'s' if self.interrupted_world_size > 1 else ''}): at {rate:g} interruptions per node-hour "
                f"({offer.capacity_type}) the work lost since the last checkpoint plus the restart takes as long "
                "as the time between interruptions (keep checkpoints on a claim instead of an emptyDir, a smaller or unset "
                "everySteps, "
                "or use on-demand)"
            )
        if self.min_price_over is not None and max_cost_per_hour is not None and not parts:
            parts.append(
                f"its smallest usable layout costs ${self.min_price_over:.2f}/h, over maxCostPerHour "
                f"${max_cost_per_hour:.2f}"
            )
        parts += [lack_words(lack, product=offer.product, pins=pins or {}) for lack in self.lacks]
        parts.extend(self.extra)
        return ". ".join(dict.fromkeys(parts)) or "no configuration fits"


def plan_summary(result: PlanResult) -> PlanSummary | None:
    """The status summary (`kubectl get motj` columns) of a plan, None for NoFit."""
    return result.plan.summary() if result.plan is not None else None

"""What the planner returns: evaluated candidates, the baseline, and the result with its reasons."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.plan import Plan, savings_text
from memfit.api.training_config import TrainingConfig
from memfit.memory.predict import MemoryEstimate
from memfit.memory.strategy import Strategy
from memfit.planner.offers import PoolRejection
from memfit.timing.step import StepTime

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration on one pool that fits, with its predicted memory, time and cost."""

    pool: str
    product: str
    strategy: Strategy
    nodes: int
    usable_bytes: int
    headroom_percent: int
    memory: MemoryEstimate
    step: StepTime
    price_per_hour: float
    hours: float
    total_cost: float
    rank: int  # preference of the configuration; breaks exact ties
    shared_node: bool = False  # part of a node other pods already use

    @property
    def gpus(self) -> int:
        return self.strategy.world_size

    def describe(self) -> str:
        """`4x NVIDIA-L4 (l4) ZeRO-2 bf16 ckpt-full mbs 2x8`."""
        return f"{self.gpus}x {self.product} ({self.pool}) {self.strategy.config.describe()}"


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """The configuration a user would run without memfit, and whether it even fits."""

    label: str
    pool: str
    product: str
    nodes: int
    world_size: int
    micro_batch_size: int
    fits: bool
    peak_bytes: int
    usable_bytes: int
    price_per_hour: float
    step_seconds: float
    hours: float
    total_cost: float
    note: str = ""
    config: TrainingConfig | None = None  # what it runs, with its micro-batch and accumulation
    # The practitioner's rungs before this one, each with why it was left (planner.practitioner).
    escalation: tuple[str, ...] = ()


def wall_clock_text(plan_hours: float, baseline_hours: float) -> str:
    """`0.42x the wall-clock` (memfit's hours over the baseline's): shown beside every cost ratio, since a
    cheaper plan may well take longer."""
    if baseline_hours <= 0 or baseline_hours == float("inf"):
        return "wall-clock n/a"
    return f"{plan_hours / baseline_hours:.2f}x the wall-clock"


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The planner's answer: a Plan and its alternatives, or NoFit with every reason."""

    plan: Plan | None
    chosen: Candidate | None
    alternatives: tuple[Candidate, ...]
    rejections: tuple[PoolRejection, ...]
    baseline: BaselineResult | None
    savings_percent: float | None
    reasons: tuple[str, ...] = ()  # problem-level reasons (no shape, impossible pins)
    notes: tuple[str, ...] = ()
    declared_baseline: BaselineResult | None = None  # placement.baseline, reported beside the default
    declared_savings_percent: float | None = None

    @property
    def fits(self) -> bool:
        return self.plan is not None

    def no_fit_reasons(self) -> list[str]:
        """Every reason nothing fits, each once: problem-level first, then per pool, the pools with the
        same reason together (`t4-spot, t4-ondemand: ...`: two T4 pools do not repeat the sentence)."""
        pools: dict[str, list[str]] = {}
        for rejection in self.rejections:
            pools.setdefault(rejection.reason, []).append(rejection.pool)
        per_pool = [f"{', '.join(names)}: {reason}" for reason, names in pools.items()]
        return list(dict.fromkeys([*self.reasons, *per_pool]))

    def no_fit_message(self) -> str:
        """The reasons in one line, for a condition or event whose reason already says NoFit."""
        return "; ".join(self.no_fit_reasons())

    def message(self) -> str:
        """One line for the CLI, a condition message or an event (`NoFit: <reasons>` without a plan)."""
        if self.chosen is None:
            return "NoFit: " + self.no_fit_message()
        c = self.chosen
        text = (
            f"Planned {c.describe()}: peak {c.memory.peak_bytes / GIB:.1f} GiB of "
            f"{c.usable_bytes / GIB:.1f} GiB, ${c.price_per_hour:.2f}/h, {c.hours:.2f} h, ${c.total_cost:.2f}"
        )
        if self.baseline is not None and self.savings_percent is not None:
            text += (
                f" vs {self.baseline.label} ${self.baseline.total_cost:.2f}: {savings_text(self.savings_percent)}, "
                f"{wall_clock_text(c.hours, self.baseline.hours)}"
            )
        elif self.baseline is None:
            text += "; no practitioner setup (DDP, checkpointing, FSDP, CPU offload) fits an allowed pool"
        if self.declared_baseline is not None and self.declared_savings_percent is not None:
            text += (
                f" ({self.declared_baseline.label} ${self.declared_baseline.total_cost:.2f}: "
                f"{savings_text(self.declared_savings_percent)})"
            )
        if self.plan is not None and self.plan.cost_notes:
            text += "; " + "; ".join(self.plan.cost_notes)
        return text

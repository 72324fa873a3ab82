"""Spot priced as risk, and checkpoints priced as writes: the expected hours of a run, and its interval.

A run of W hours of work checkpoints every τ hours of work; each checkpoint writes for C hours. Without
interruptions it takes W + C W / τ: a write after every interval, the last one included (the trainer
saves at the end too; counting it keeps the hours non-decreasing in C whatever interval is chosen).
An interruption of any node stops the whole job; it loses the wall-clock time since the last finished
checkpoint (half a segment τ + C on average, for interruptions at uniformly random times) and pays a
restart R (reschedule, image pull, process start, checkpoint load). With λ interruptions per hour a
fraction λ ((τ + C) / 2 + R) of the wall-clock time is wasted, so

    expected hours = (W + C W / τ) / (1 − λ ((τ + C) / 2 + R)),

infinite when that fraction reaches 1 (the run never finishes). This is the first-order model of Young
(1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9)): its wasted
fraction ≈ C / τ + λ (τ / 2 + R), minimised at τ* = √(2 C / λ). The expression above is quasi-convex in
τ; its minimiser is the positive root of λ/2 τ² + λ C τ − C (1 − λ (C / 2 + R)) = 0, that is
−C + √(C² + 2 C (1 − λ (C / 2 + R)) / λ): Young's √(2 C / λ) when C and λR are small, less about C as
in Daly's higher-order estimate (2006, "A higher order estimate of the optimum checkpoint interval for
restart dumps", FGCS 22(3)). Without a persistent checkpoint (`training.checkpoint.emptyDir`:
checkpoints live on the lost node) the interval is the whole run and writes cost nothing worth pricing
(local disk).

When the job leaves `training.checkpoint.everySteps` unset, memfit chooses the interval in whole steps:
on a pool with interruptions the better of the two whole-step intervals around that minimiser (by
quasi-convexity one of them is the best of all), within [1 step, the run]; on a pool without them
`ON_DEMAND_EVERY_STEPS` (the old fixed default: a crash or a re-plan still resumes), or more steps when
that is what keeps the writes within `MAX_WRITE_OVERHEAD` of the run. The expected hours stay
non-decreasing in the step time and in the write time under both choices (the minimum over intervals of
functions non-decreasing in C; on-demand C W / τ = min(C W / τ₀, 1 % of W)), which the search's bounds
and its 8-bit/32-bit twin shortcut rely on (planner.search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.api.job import DEFAULT_CHECKPOINT_EVERY_STEPS

# Seconds from an interruption until training runs again: a new node (autoscaler), the trainer image
# pulled and started, the checkpoint loaded. A round middle of the minutes GPU nodes take to join.
RESTART_SECONDS = 300.0
# Without interruptions: the old fixed interval, unless the writes would take more than 1 % of the run.
ON_DEMAND_EVERY_STEPS = DEFAULT_CHECKPOINT_EVERY_STEPS
MAX_WRITE_OVERHEAD = 0.01


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """How the job checkpoints: `persistent` False (emptyDir): nothing survives a lost node;
    `every_steps` the job's pinned interval, None: memfit chooses one per plan."""

    persistent: bool = True
    every_steps: int | None = None

    @property
    def chosen(self) -> bool:
        """Whether memfit chooses the interval."""
        return self.persistent and self.every_steps is None


NO_PERSISTENT_CHECKPOINT = CheckpointPolicy(persistent=False)


@dataclass(frozen=True, slots=True)
class InterruptionRisk:
    """Expected cost of checkpoint writes and interruptions for one run on one pool."""

    rate_per_hour: float  # interruptions per hour of the job (per node-hour x nodes)
    checkpoint_hours: float  # work between persistent checkpoints (the whole run without them)
    hours: float  # the work, without writes or interruptions
    expected_hours: float  # with writes, lost work and restarts (inf: never finishes)
    write_hours: float = 0.0  # one checkpoint's write

    @property
    def writing_hours(self) -> float:
        """Hours spent writing checkpoints over the run, the last one included (without interruptions)."""
        return _writing_hours(self.hours, self.checkpoint_hours, self.write_hours)

    @property
    def extra_hours(self) -> float:
        return self.expected_hours - self.hours

    @property
    def expected_interruptions(self) -> float:
        return self.rate_per_hour * self.expected_hours


def _writing_hours(hours: float, interval_hours: float, write_hours: float) -> float:
    """C W / τ: a write after every interval, the last included."""
    if interval_hours <= 0 or write_hours <= 0:
        return 0.0
    return write_hours * hours / interval_hours


def run_hours(*, hours: float, interval_hours: float, write_hours: float, rate_per_hour: float) -> float:
    """(W + C W / τ) / (1 − λ ((τ + C) / 2 + R)) (the module docstring), inf when it never finishes."""
    wall = hours + _writing_hours(hours, interval_hours, write_hours)
    if rate_per_hour <= 0:
        return wall
    wasted = rate_per_hour * ((interval_hours + write_hours) / 2 + RESTART_SECONDS / 3600)
    return math.inf if wasted >= 1 else wall / (1 - wasted)


def young_interval_hours(*, write_hours: float, rate_per_hour: float) -> float:
    """Young's optimum interval √(2 C / λ) (inf without interruptions)."""
    return math.inf if rate_per_hour <= 0 else math.sqrt(2 * write_hours / rate_per_hour)


def optimal_interval_hours(*, hours: float, write_hours: float, rate_per_hour: float) -> float:
    """The τ in (0, W] minimising `run_hours`: −C + √(C² + 2 C (1 − λ (C / 2 + R)) / λ), the positive root
    of λ/2 τ² + λ C τ − C (1 − λ (C / 2 + R)) where its derivative turns positive (W without interruptions
    or when the root lies beyond the run; 0 when nothing finishes anyway)."""
    w, c = hours, write_hours
    if rate_per_hour <= 0 or w <= 0:
        return w
    left = 1 - rate_per_hour * (c / 2 + RESTART_SECONDS / 3600)
    if left <= 0:
        return 0.0
    if c <= 0:
        return 0.0  # free writes: every step
    return min(w, -c + math.sqrt(c * c + 2 * c * left / rate_per_hour))


def chosen_every_steps(*, steps: int, step_seconds: float, write_seconds: float, rate_per_hour: float) -> int:
    """The interval memfit chooses, in whole steps within [1, steps] (the module docstring)."""
    top = max(1, steps)
    if step_seconds <= 0:
        return top
    if rate_per_hour <= 0:
        floor = math.ceil(write_seconds / (MAX_WRITE_OVERHEAD * step_seconds))
        return min(top, max(ON_DEMAND_EVERY_STEPS, floor, 1))
    hours = steps * step_seconds / 3600
    best = optimal_interval_hours(hours=hours, write_hours=write_seconds / 3600, rate_per_hour=rate_per_hour)
    around = best * 3600 / step_seconds
    candidates = {min(top, max(1, math.floor(around))), min(top, max(1, math.ceil(around)))}

    def cost(k: int) -> tuple[float, int]:
        interval = min(hours, k * step_seconds / 3600)
        return run_hours(hours=hours, interval_hours=interval, write_hours=write_seconds / 3600,
                         rate_per_hour=rate_per_hour), -k  # a tie goes to fewer writes

    return min(candidates, key=cost)


def priced_every_steps(*, steps: int, step_seconds: float, write_seconds: float, rate_per_hour: float) -> float:
    """The interval the search prices: `chosen_every_steps`, except on a pool without interruptions,
    where it is the unrounded max(ON_DEMAND_EVERY_STEPS, write / (1 % of a step)) within the run: rounding
    that up to whole steps (what the trainer is given) only writes a little less, and pricing the
    unrounded one keeps the hours exactly non-decreasing in the write time (C W / τ = min(C W / τ₀, 1 % W))."""
    if rate_per_hour > 0 or step_seconds <= 0:
        return float(chosen_every_steps(steps=steps, step_seconds=step_seconds, write_seconds=write_seconds,
                                        rate_per_hour=rate_per_hour))
    return float(min(max(1, steps), max(ON_DEMAND_EVERY_STEPS, write_seconds / (MAX_WRITE_OVERHEAD * step_seconds))))


def interruption_risk(*, hours: float, step_seconds: float, rate_per_node_hour: float, nodes: int,
                      checkpoint_every_steps: float | None, write_seconds: float = 0.0) -> InterruptionRisk:
    """The run of `hours` (steps of `step_seconds`) on `nodes` nodes that are each interrupted
    `rate_per_node_hour` times an hour on average, checkpointing every `checkpoint_every_steps` steps
    (None: no persistent checkpoint, and no write priced) in `write_seconds` each."""
    rate = max(0.0, rate_per_node_hour) * nodes
    if checkpoint_every_steps is None:
        interval, write = hours, 0.0
    else:
        interval, write = min(hours, checkpoint_every_steps * step_seconds / 3600), write_seconds / 3600
    expected = run_hours(hours=hours, interval_hours=interval, write_hours=write, rate_per_hour=rate)
    return InterruptionRisk(rate, interval, hours, expected, write)


def expected_hours(*, hours: float, step_seconds: float, rate_per_node_hour: float, nodes: int,
                   checkpoint_every_steps: float | None, write_seconds: float = 0.0) -> float:
    """`interruption_risk(...).expected_hours` without building the value (the search's hot path);
    non-decreasing in `step_seconds` and `write_seconds`, so lower bounds on them stay lower bounds."""
    if checkpoint_every_steps is None:
        interval, write = hours, 0.0
    else:
        interval, write = min(hours, checkpoint_every_steps * step_seconds / 3600), write_seconds / 3600
    if rate_per_node_hour <= 0 and write <= 0:
        return hours
    return run_hours(hours=hours, interval_hours=interval, write_hours=write,
                     rate_per_hour=max(0.0, rate_per_node_hour) * nodes)

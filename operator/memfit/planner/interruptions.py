"""Spot priced as risk: the expected hours of a run on nodes that can be interrupted.

An interruption of any node stops the whole job; it loses the work since the last checkpoint (half a
checkpoint interval on average, for interruptions at uniformly random times) and pays a restart
(reschedule, image pull, process start, checkpoint load). Over a long run a fraction
rate x (interval / 2 + restart) of the wall-clock time is wasted, so the expected hours are
hours / (1 - that fraction); a fraction of 1 or more never finishes (infinite). Without a persistent
checkpoint (`training.checkpoint.emptyDir`, so checkpoints live on the lost node) the
interval is the whole run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Seconds from an interruption until training runs again: a new node (autoscaler), the trainer image
# pulled and started, the checkpoint loaded. A round middle of the minutes GPU nodes take to join.
RESTART_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class InterruptionRisk:
    """Expected cost of interruptions for one run on one pool."""

    rate_per_hour: float  # interruptions per hour of the job (per node-hour x nodes)
    checkpoint_hours: float  # work between persistent checkpoints (the whole run without them)
    hours: float  # the run without interruptions
    expected_hours: float  # with lost work and restarts (inf: never finishes)

    @property
    def extra_hours(self) -> float:
        return self.expected_hours - self.hours

    @property
    def expected_interruptions(self) -> float:
        return self.rate_per_hour * self.expected_hours


def interruption_risk(*, hours: float, step_seconds: float, rate_per_node_hour: float, nodes: int,
                      checkpoint_every_steps: int | None) -> InterruptionRisk:
    """The run of `hours` (steps of `step_seconds`) on `nodes` nodes that are each interrupted
    `rate_per_node_hour` times an hour on average; `checkpoint_every_steps` None: no persistent one."""
    rate = rate_per_node_hour * nodes
    interval = hours if checkpoint_every_steps is None else min(hours, checkpoint_every_steps * step_seconds / 3600)
    if rate <= 0:
        return InterruptionRisk(0.0, interval, hours, hours)
    wasted = rate * (interval / 2 + RESTART_SECONDS / 3600)
    expected = math.inf if wasted >= 1 else hours / (1 - wasted)
    return InterruptionRisk(rate, interval, hours, expected)


def expected_hours(*, hours: float, step_seconds: float, rate_per_node_hour: float, nodes: int,
                   checkpoint_every_steps: int | None) -> float:
    """`interruption_risk(...).expected_hours` without building the value (the search's hot path);
    non-decreasing in `step_seconds`, so a lower bound on step time stays a lower bound on cost."""
    if rate_per_node_hour <= 0:
        return hours
    rate = rate_per_node_hour * nodes
    interval = hours if checkpoint_every_steps is None else min(hours, checkpoint_every_steps * step_seconds / 3600)
    wasted = rate * (interval / 2 + RESTART_SECONDS / 3600)
    return math.inf if wasted >= 1 else hours / (1 - wasted)

"""The re-plan counter's pre-created series are the attempt outcomes that start a new attempt."""

from __future__ import annotations

from memfit.api.job import AttemptOutcome
from memfit.metrics import REPLAN_REASONS


def test_every_outcome_that_starts_a_new_attempt_has_a_series_from_the_start() -> None:
    assert set(REPLAN_REASONS) == {o.value for o in AttemptOutcome if o.replans}

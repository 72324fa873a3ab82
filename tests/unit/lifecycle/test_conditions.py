"""Conditions keep lastTransitionTime unless the status flips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memfit.lifecycle.conditions import initial_conditions, set_condition

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_initial_conditions_are_unknown() -> None:
    conds = initial_conditions(1, T0)
    assert [c.type for c in conds] == ["Profiled", "Planned", "Running", "Succeeded", "Failed"]
    assert {c.status.value for c in conds} == {"Unknown"}


def test_transition_time_moves_only_on_status_change() -> None:
    conds = set_condition([], type_="Running", status=False, reason="A", message="", generation=1, now=T0)
    later = T0 + timedelta(minutes=5)
    same = set_condition(
        conds, type_="Running", status=False, reason="B", message="m", generation=2, now=later
    )
    assert same[0].to_wire()["lastTransitionTime"] == "2026-12-01T00:00:00Z" and same[0].reason == "B"
    flipped = set_condition(
        same, type_="Running", status=True, reason="C", message="", generation=2, now=later
    )
    assert flipped[0].to_wire()["lastTransitionTime"] == "2026-12-01T00:05:00Z"
    assert flipped[0].observed_generation == 2

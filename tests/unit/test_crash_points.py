"""Crash points are named by the write (description, occurrence), so a run whose timing differs from
the clean run's still dies after the same write (hack/memfit_testbed/reliability/crashpoints.py)."""

from __future__ import annotations

import pytest
from memfit_testbed.reliability.crashpoints import Crash, CrashingApi, write_points

CLEAN = ["ensure ConfigMap <job>-plan", "status Planning", "ensure Job <job>-a0", "status Running",
         "event PodsRunning", "status Planning", "status Succeeded", "event TrainingSucceeded"]


def api(job: str, point: tuple[str, int] | None) -> CrashingApi:
    return CrashingApi(None, None, None, job=job, crash_at=point)  # _wrote touches no API


def test_points_count_repeated_writes() -> None:
    points = write_points(CLEAN)
    assert points[1] == ("status Planning", 1) and points[5] == ("status Planning", 2)
    assert len(points) == len(CLEAN) and len(set(points)) == len(CLEAN)


def test_a_faster_run_still_dies_after_the_named_write() -> None:
    faster = api("plain-k07", ("status Succeeded", 1))
    for what in ("ensure ConfigMap plain-k07-plan", "status Planning", "ensure Job plain-k07-a0", "status Planning"):
        faster._wrote(what)  # no Running seen: one write fewer than the clean run
    with pytest.raises(Crash, match="status Succeeded"):
        faster._wrote("status Succeeded")
    assert faster.writes[0] == "ensure ConfigMap <job>-plan"


def test_second_occurrence_waits_for_the_second_write() -> None:
    second = api("oom-k06", ("status Planning", 2))
    second._wrote("status Planning")
    with pytest.raises(Crash):
        second._wrote("status Planning")

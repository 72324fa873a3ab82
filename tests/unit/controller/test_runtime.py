"""The operator's Runtime: which jobs the resync skips as finished."""

from __future__ import annotations

import time

from memfit.controller.handlers import MAX_RECHECK_SECONDS, Runtime


def test_a_job_that_just_failed_is_not_skipped_until_its_release_pass_went_through() -> None:
    """The pass that stores Failed asks for another (to delete its unfinished children); if that pass
    fails (the API server, a denied delete), the resync must still come back to the job."""
    runtime = Runtime()
    key = ("ns", "j")
    runtime.note(key, phase="Failed", written="7", settled=False)
    assert not runtime.terminal(key), "the release pass is still due"
    runtime.note(key, phase="Failed", written="", settled=True)
    assert runtime.terminal(key)
    runtime.note(("ns", "ok"), phase="Succeeded", written="9")
    assert runtime.terminal(("ns", "ok"))


def test_a_job_whose_decision_asked_for_a_later_look_is_skipped_by_the_resync_until_then() -> None:
    runtime = Runtime()
    key = ("ns", "running")
    runtime.note(key, phase="Running", written="", recheck_after=3600)
    assert not runtime.recheck_due(key)
    runtime.note(key, phase="Running", written="", recheck_after=0)
    assert runtime.recheck_due(key)
    runtime.note(key, phase="Running", written="")  # no later look asked: every resync
    assert runtime.recheck_due(key)


def test_the_wait_a_decision_asks_for_is_capped_so_a_missed_event_is_found() -> None:
    runtime = Runtime()
    key = ("ns", "running")
    runtime.note(key, phase="Running", written="", recheck_after=10 * MAX_RECHECK_SECONDS)
    at = runtime._recheck_at[key]
    assert at - time.monotonic() <= MAX_RECHECK_SECONDS


def test_passes_of_launched_and_finished_jobs_are_routine_the_others_urgent() -> None:
    runtime = Runtime()
    for phase, routine in (("Pending", False), ("Planning", False), ("Replanning", False), ("Launching", True),
                           ("Running", True), ("Succeeded", True)):
        runtime.note(("ns", phase), phase=phase, written="")
        assert runtime.routine(("ns", phase)) is routine, phase
    assert not runtime.routine(("ns", "never-seen"))  # e.g. listed after a restart


def test_the_resync_walks_the_jobs_the_watch_showed_and_forgets_deleted_ones() -> None:
    runtime = Runtime()
    runtime.seen(("ns", "a"))
    runtime.note(("ns", "b"), phase="Running", written="")
    assert sorted(runtime.known()) == [("ns", "a"), ("ns", "b")]
    runtime.forget(("ns", "a"))
    assert runtime.known() == [("ns", "b")]


def _motj(rv: str, uid: str = "u1", phase: str = "") -> dict:
    return {"metadata": {"name": "j", "namespace": "ns", "uid": uid, "resourceVersion": rv,
                         "managedFields": [{"manager": "kubectl"}]}, "status": {"phase": phase}}


def test_the_newest_body_is_kept_and_an_older_watch_event_does_not_replace_it() -> None:
    runtime = Runtime()
    key = ("ns", "j")
    runtime.remember(key, _motj("20", phase="Launching"))  # our status patch's answer
    runtime.remember(key, _motj("12", phase="Pending"))  # a late watch event of an older version
    kept = runtime.body(key)
    assert kept is not None and kept["status"]["phase"] == "Launching"
    assert "managedFields" not in kept["metadata"]
    runtime.remember(key, _motj("25", phase="Running"))
    assert runtime.body(key)["status"]["phase"] == "Running"  # type: ignore[index]
    runtime.remember(key, _motj("3", uid="u2"))  # deleted and created again under the same name
    assert runtime.body(key)["metadata"]["uid"] == "u2"  # type: ignore[index]


def test_a_dropped_or_forgotten_body_is_read_again() -> None:
    runtime = Runtime()
    key = ("ns", "j")
    runtime.remember(key, _motj("20"))
    runtime.drop_body(key)
    assert runtime.body(key) is None
    runtime.remember(key, _motj("21"))
    runtime.forget(key)
    assert runtime.body(key) is None

"""The operator's Runtime: which jobs the resync skips as finished."""

from __future__ import annotations

from memfit.controller.handlers import Runtime


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

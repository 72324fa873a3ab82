"""The Jobs the operator's watch showed answer a pass's reads while trusted (controller.watched_jobs)."""

from __future__ import annotations

from typing import Any

from memfit.controller.watched_jobs import TRUST_SECONDS, WatchedJobs


def job(name: str, rv: str, uid: str = "u1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid, "resourceVersion": rv,
                         "managedFields": [{"manager": "x"}]}, "status": status}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_newest_version_is_kept_and_an_older_event_does_not_replace_it() -> None:
    jobs = WatchedJobs(clock=Clock())
    jobs.seen(job("a", "10", active=1))
    jobs.seen(job("a", "9", active=0))  # a late event of an older version
    kept = jobs.get("ns", "a")
    assert kept is not None and kept["status"] == {"active": 1}
    assert "managedFields" not in kept["metadata"]
    jobs.seen(job("a", "11", succeeded=1))
    assert jobs.get("ns", "a")["status"] == {"succeeded": 1}  # type: ignore[index]


def test_a_recreated_job_replaces_the_old_one_whatever_its_version() -> None:
    jobs = WatchedJobs(clock=Clock())
    jobs.seen(job("a", "50", uid="old"))
    jobs.seen(job("a", "7", uid="new"))
    assert jobs.get("ns", "a")["metadata"]["uid"] == "new"  # type: ignore[index]


def test_a_deleted_job_is_read_from_the_api_server_again() -> None:
    jobs = WatchedJobs(clock=Clock())
    jobs.seen(job("a", "1"))
    jobs.gone("ns", "a")
    assert jobs.get("ns", "a") is None and len(jobs) == 0


def test_a_body_is_trusted_only_for_a_while_so_a_missed_deletion_is_found() -> None:
    clock = Clock()
    jobs = WatchedJobs(clock=clock)
    jobs.seen(job("a", "1"))
    clock.now = TRUST_SECONDS
    assert jobs.get("ns", "a") is not None
    clock.now = TRUST_SECONDS + 0.1
    assert jobs.get("ns", "a") is None  # the caller reads the API server (and keeps what it finds)
    jobs.seen(job("a", "1"))
    assert jobs.get("ns", "a") is not None
    assert (jobs.hits, jobs.misses) == (2, 1)


def test_the_echo_of_a_kept_version_is_no_news_and_any_other_version_is() -> None:
    clock = Clock()
    jobs = WatchedJobs(clock=clock)
    assert jobs.seen(job("a", "5"))  # as the operator's create left it
    clock.now = TRUST_SECONDS  # the watch's ADDED event of that same version: nothing to look at
    assert not jobs.seen(job("a", "5"))
    clock.now = 2 * TRUST_SECONDS  # ... and it renewed the trust
    assert jobs.get("ns", "a") is not None
    assert jobs.seen(job("a", "6", active=1))
    assert jobs.seen(job("a", "6", uid="other"))  # another Job of the same name
    assert jobs.seen(job("b", "6"))

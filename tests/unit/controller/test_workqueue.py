"""The work queue: each job queued once, never processed twice at a time, no event lost."""

from __future__ import annotations

import threading
import time

import pytest
from memfit.controller.workqueue import Key, WorkQueue

A, B = ("ns", "a"), ("ns", "b")


def test_a_key_is_queued_once_in_arrival_order() -> None:
    q = WorkQueue()
    for key in (A, B, A, A, B):
        q.add(key)
    assert len(q) == 2
    assert [q.get(0), q.get(0), q.get(0)] == [A, B, None]


def test_a_key_added_while_processing_comes_back_once_after_done() -> None:
    q = WorkQueue()
    q.add(A)
    assert q.get(0) == A
    q.add(A)
    q.add(A)
    assert q.get(0) is None  # not handed to a second worker while the first has it
    q.done(A)
    assert q.get(0) == A
    q.done(A)
    assert q.get(0) is None


def test_busy_within_covers_queued_processing_and_recently_done() -> None:
    now = [100.0]
    q = WorkQueue(clock=lambda: now[0])
    assert not q.busy_within(A, 5)
    q.add(A)
    assert q.busy_within(A, 5)
    q.get(0)
    assert q.busy_within(A, 5)
    q.done(A)
    now[0] += 4.9
    assert q.busy_within(A, 5)
    now[0] += 0.2
    assert not q.busy_within(A, 5)


def test_close_wakes_a_waiting_worker() -> None:
    q = WorkQueue()
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    q.close()
    worker.join(timeout=5)
    assert got == [None]


def test_urgent_keys_go_before_routine_ones() -> None:
    q = WorkQueue()
    q.add(A, urgent=False)
    q.add(B)
    assert [q.get(0), q.get(0)] == [B, A]


def test_an_urgent_add_moves_a_routine_key_ahead_once() -> None:
    q = WorkQueue()
    C = ("ns", "c")
    q.add(A, urgent=False)
    q.add(C)
    q.add(A)  # now urgent: behind C, and only once
    assert len(q) == 2
    assert [q.get(0), q.get(0), q.get(0)] == [C, A, None]


def test_a_routine_key_is_delayed_not_starved() -> None:
    now = [0.0]
    q = WorkQueue(clock=lambda: now[0], routine_max_wait=5)
    q.add(A, urgent=False)
    for i in range(3):
        q.add(("ns", f"new-{i}"))
    assert q.get(0) == ("ns", "new-0")
    now[0] = 5.0  # A waited its limit: it goes before the urgent keys still queued
    assert q.get(0) == A
    assert q.get(0) == ("ns", "new-1")


def test_urgency_of_a_key_added_while_processing_is_kept() -> None:
    q = WorkQueue()
    q.add(A)
    assert q.get(0) == A
    q.add(A, urgent=False)
    q.add(A)  # urgent wins
    q.add(B)
    q.done(A)
    assert [q.get(0), q.get(0)] == [B, A]  # both urgent, in the order they became queued


def test_an_urgent_only_worker_leaves_routine_keys_to_the_others() -> None:
    q = WorkQueue()
    q.add(A, urgent=False)
    assert q.get(0, urgent_only=True) is None
    q.add(B)
    assert q.get(0, urgent_only=True) == B
    assert q.get(0) == A


def test_each_kind_of_waiting_worker_is_woken_by_the_keys_it_takes() -> None:
    """A routine key wakes a worker that takes it, not only an urgent-only one; an urgent key wakes an
    urgent-only worker even while the others wait too."""
    q = WorkQueue()
    got: dict[str, object] = {}
    urgent_only = threading.Thread(target=lambda: got.setdefault("urgent-only", q.get(30, urgent_only=True)))
    urgent_only.start()
    any_kind = threading.Thread(target=lambda: got.setdefault("any", q.get(30)))
    any_kind.start()
    q.add(A, urgent=False)
    any_kind.join(timeout=30)
    assert got == {"any": A}
    q.add(B)
    urgent_only.join(timeout=30)
    assert got == {"any": A, "urgent-only": B}


def test_close_wakes_urgent_only_workers() -> None:
    q = WorkQueue()
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.get(urgent_only=True)))
    worker.start()
    q.close()
    worker.join(timeout=5)
    assert got == [None]


@pytest.mark.parametrize("min_wait", [0.0, 0.05])
def test_workers_without_timeouts_take_every_key_of_both_kinds(min_wait: float) -> None:
    """Workers that sleep until woken (no polling): every key added, urgent or routine, from several
    threads at once, is taken; none waits for a wake-up that went to the wrong kind of worker, and with a
    minimum wait none is stranded when the worker timing the oldest routine key hands that on."""
    q = WorkQueue(routine_min_wait=min_wait)
    keys = [("ns", f"k{i}") for i in range(400)]
    taken: list[Key] = []
    lock = threading.Lock()
    all_taken = threading.Event()

    def worker(urgent_only: bool) -> None:
        while (key := q.get(urgent_only=urgent_only)) is not None:
            with lock:
                taken.append(key)
                if len(taken) == len(keys):
                    all_taken.set()
            q.done(key)

    workers = [threading.Thread(target=worker, args=(i % 2 == 0,)) for i in range(8)]
    for w in workers:
        w.start()
    producers = [threading.Thread(target=lambda part=part: [q.add(k, urgent=int(k[1][1:]) % 3 != 0) for k in part])
                 for part in (keys[0::2], keys[1::2])]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    assert all_taken.wait(60), f"{len(keys) - len(taken)} keys never taken"
    q.close()
    for w in workers:
        w.join(timeout=10)
    assert sorted(taken) == sorted(keys)
    assert not any(w.is_alive() for w in workers)


def test_a_routine_key_waits_its_minimum_so_a_running_jobs_events_fold_into_one_pass() -> None:
    now = [0.0]
    queue = WorkQueue(clock=lambda: now[0], routine_min_wait=1.0)
    queue.add(("ns", "a"), urgent=False)
    assert queue.get(timeout=0) is None  # younger than a second: not yet
    now[0] = 0.5
    queue.add(("ns", "a"), urgent=False)  # another event of the same job: folded, its age kept
    queue.add(("ns", "b"))  # an urgent key is not held back
    assert queue.get(timeout=0) == ("ns", "b")
    now[0] = 1.0
    assert queue.get(timeout=0) == ("ns", "a")
    assert queue.get(timeout=0) is None


def test_a_worker_waiting_on_a_young_routine_key_takes_it_once_it_is_ripe() -> None:
    queue = WorkQueue(routine_min_wait=0.2)
    queue.add(("ns", "a"), urgent=False)
    started = time.monotonic()
    assert queue.get(timeout=5) == ("ns", "a")  # no other add wakes the worker: it woke itself
    assert 0.15 <= time.monotonic() - started < 5


def test_no_worker_is_lost_when_timed_waits_race_wake_ups() -> None:
    """Routine keys trickle in while workers wait for the oldest to be ripe (timed waits that end just as
    a wake-up picks them): every key is still taken, none is left queued with every worker asleep."""
    q = WorkQueue(routine_min_wait=0.003)
    keys = [("ns", f"t{i}") for i in range(1500)]
    taken: set[Key] = set()
    lock = threading.Lock()
    all_taken = threading.Event()

    def worker(urgent_only: bool) -> None:
        while (key := q.get(urgent_only=urgent_only)) is not None:
            with lock:
                taken.add(key)
                if len(taken) == len(keys):
                    all_taken.set()
            q.done(key)

    workers = [threading.Thread(target=worker, args=(i >= 6,), daemon=True) for i in range(12)]
    for w in workers:
        w.start()

    def produce(part: list[Key]) -> None:
        for i, k in enumerate(part):
            q.add(k, urgent=i % 5 == 0)
            if i % 7 == 0:
                q.add(k)  # promoted: its routine entry is left behind, stale
            if i % 3 == 0:
                time.sleep(0.001)

    producers = [threading.Thread(target=produce, args=(keys[j::2],)) for j in range(2)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    assert all_taken.wait(60), f"{len(keys) - len(taken)} keys never taken: the queue stalled"
    q.close()
    for w in workers:
        w.join(timeout=10)


def test_a_wake_up_that_meets_a_timed_out_wait_loses_no_worker() -> None:
    """The race behind that stall, forced: every wait reports a time-out, also when a wake-up picked it
    (its timed wait ended just as the key came). Sleeping workers must stay counted: each key, added
    one at a time, is still taken."""
    q = WorkQueue(routine_min_wait=0.01)
    wait = q._cond.wait

    def raced_wait(timeout: float | None = None) -> bool:
        wait(timeout)
        return False

    q._cond.wait = raced_wait  # type: ignore[method-assign]
    taken: list[Key] = []
    got = threading.Condition()

    def worker() -> None:
        while (key := q.get()) is not None:
            with got:
                taken.append(key)
                got.notify_all()
            q.done(key)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(3)]
    for w in workers:
        w.start()
    for i in range(30):
        deadline = time.monotonic() + 10
        while len(q._asleep[q._cond]) < 3:  # every worker back asleep (and counted) before the next key
            assert time.monotonic() < deadline, f"before key {i}: a sleeping worker is no longer counted"
            time.sleep(0.001)
        q.add(("ns", f"k{i}"), urgent=False)
        with got:
            assert got.wait_for(lambda i=i: len(taken) > i, timeout=10), f"key {i} never taken: a worker was lost"
    q.close()
    for w in workers:
        w.join(timeout=10)


def test_a_routine_key_after_a_promoted_one_still_wakes_a_worker() -> None:
    """A routine key promoted to urgent leaves its routine entry behind; once that stale entry is gone,
    the next routine key still wakes a sleeping worker."""
    q = WorkQueue(routine_min_wait=0.05)
    q.add(A, urgent=False)  # no worker asleep: the call for a timing worker reaches nobody
    q.add(A)  # promoted
    assert q.get(0) == A
    q.done(A)
    got: list[Key | None] = []
    worker = threading.Thread(target=lambda: got.append(q.get()), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not q._asleep[q._cond]:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    q.add(B, urgent=False)
    worker.join(timeout=5)
    q.close()
    assert got == [B], "the routine key woke no worker"

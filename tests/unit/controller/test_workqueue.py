"""The work queue: each job queued once, never processed twice at a time, no event lost."""

from __future__ import annotations

import threading

from memfit.controller.workqueue import WorkQueue

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

"""A de-duplicating work queue of jobs to reconcile (the shape of client-go's workqueue).

kopf delivers every watch event; many events of one job mean one more reconcile, not many. A key is
in the queue at most once; a key added while a worker reconciles it is queued again when that worker
is done, so no event is lost and no job is reconciled twice at the same time. Events no longer wait
in an executor holding their bodies: at 1,000 jobs that backlog was most of the operator's memory.

Two priorities (the shape of controller-runtime's priority queue): a job that waits to be launched or
re-planned comes before a pass that refreshes a running job's status, so a burst of new jobs is not
queued behind the watch events of the ones already running. A waiting routine pass is taken first once
it waited `routine_max_wait` seconds, so routine work is delayed, never starved; and none is taken before
it waited `routine_min_wait` seconds (client-go's AddAfter), so the events a running job's Job and pods
send within that time are folded into one pass however many workers are idle.

Workers are of two kinds: every worker takes urgent keys, only some take routine ones
(`get(urgent_only=True)` for the rest). A launch pass is a chain of API round trips, so more of them in
flight launch a burst faster; routine passes are better few: events of a running job that arrive while
its key waits are folded into one pass, and with as many routine workers as launch workers a burst's
refreshes ran sooner and folded less (more passes, pod lists and status patches for the same jobs).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

Key = tuple[str, str]  # (namespace, name)


ROUTINE_MAX_WAIT_SECONDS = 30.0


class _Sleeper:
    """A waiting worker's flag: set when a wake-up was sent for it (compared by identity)."""

    __slots__ = ("picked",)

    def __init__(self) -> None:
        self.picked = False


class WorkQueue:
    """Two FIFOs of keys (urgent, routine), each key queued at most once and processed by one worker at
    a time."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, routine_max_wait: float = ROUTINE_MAX_WAIT_SECONDS,
        routine_min_wait: float = 0.0,
    ) -> None:
        self._clock = clock
        self._routine_max_wait = routine_max_wait
        self._routine_min_wait = routine_min_wait
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # workers that take any key wait here
        self._urgent_cond = threading.Condition(self._lock)  # urgent-only workers wait here
        # Waiting workers of each kind not yet woken, one flag each: a key wakes one worker that takes it,
        # and only one (each wake-up is a thread switch; at 64 workers they were a twentieth of the
        # operator's CPU). A flag, not a count: a worker whose timed wait ended just as it was picked
        # must not be counted out twice, or a sleeping worker is never woken again (a stalled queue).
        self._asleep: dict[threading.Condition, deque[_Sleeper]] = {self._cond: deque(), self._urgent_cond: deque()}
        self._urgent: deque[Key] = deque()
        self._routine: deque[tuple[float, Key]] = deque()  # (queued at, key); may hold promoted keys
        self._queued: dict[Key, bool] = {}  # key -> urgent
        self._processing: set[Key] = set()
        self._dirty: dict[Key, bool] = {}
        self._done_at: dict[Key, float] = {}
        self._closed = False

    def add(self, key: Key, *, urgent: bool = True) -> None:
        """Queue `key` (once); an urgent add of a key queued as routine moves it ahead."""
        with self._cond:
            if key in self._processing:
                self._dirty[key] = self._dirty.get(key, False) or urgent
            else:
                self._enqueue(key, urgent)

    def _enqueue(self, key: Key, urgent: bool) -> None:
        was = self._queued.get(key)
        if was is None or (urgent and not was):
            self._queued[key] = urgent
            if urgent:
                self._urgent.append(key)
            else:
                self._routine.append((self._clock(), key))
            self._wake(self._urgent_cond if urgent and self._asleep[self._urgent_cond] else self._cond)

    def _wake(self, cond: threading.Condition) -> None:
        if self._asleep[cond]:
            self._asleep[cond].popleft().picked = True
            cond.notify()

    def get(self, timeout: float | None = None, *, urgent_only: bool = False) -> Key | None:
        """The next key (now being processed), or None when closed or after `timeout` seconds.
        `urgent_only`: wait for an urgent key, leaving routine ones to the other workers."""
        cond = self._urgent_cond if urgent_only else self._cond
        with self._lock:
            deadline = None if timeout is None else self._clock() + timeout
            while True:
                if self._closed:
                    return None
                key = self._next(urgent_only)
                if key is not None:
                    del self._queued[key]
                    self._processing.add(key)
                    return key
                remaining = None if deadline is None else deadline - self._clock()
                if remaining is not None and remaining <= 0:
                    return None
                if not urgent_only and (ripe := self._routine_ripe_in()) is not None:
                    remaining = ripe if remaining is None else min(remaining, ripe)
                sleeper = _Sleeper()
                self._asleep[cond].append(sleeper)
                cond.wait(remaining)
                if not sleeper.picked:  # timed out (or woken by a notify meant for a worker whose wait ended)
                    self._asleep[cond].remove(sleeper)

    def _next(self, urgent_only: bool = False) -> Key | None:
        """A routine key that waited too long, else the first urgent key, else the first routine key
        (skipping entries of keys since promoted to urgent or already taken)."""
        if urgent_only:
            return self._urgent.popleft() if self._urgent else None
        while self._routine and self._queued.get(self._routine[0][1]) is not False:
            self._routine.popleft()
        if self._routine:
            waited = self._clock() - self._routine[0][0]
            if waited >= self._routine_max_wait or (not self._urgent and waited >= self._routine_min_wait):
                return self._routine.popleft()[1]
        if self._urgent:
            return self._urgent.popleft()
        return None

    def _routine_ripe_in(self) -> float | None:
        """Seconds until the oldest routine key has waited `routine_min_wait` (None: no routine key)."""
        if not self._routine:
            return None
        return max(0.001, self._routine[0][0] + self._routine_min_wait - self._clock())

    def done(self, key: Key) -> None:
        """The worker finished `key`; queue it again if it was added meanwhile."""
        with self._cond:
            self._processing.discard(key)
            self._done_at[key] = self._clock()
            if key in self._dirty:
                self._enqueue(key, self._dirty.pop(key))

    def busy_within(self, key: Key, seconds: float) -> bool:
        """Queued, being processed, or finished less than `seconds` ago."""
        with self._cond:
            if key in self._queued or key in self._processing:
                return True
            return self._clock() - self._done_at.get(key, -1e18) < seconds

    def forget(self, key: Key) -> None:
        with self._cond:
            self._done_at.pop(key, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for cond, asleep in self._asleep.items():
                for sleeper in asleep:
                    sleeper.picked = True
                asleep.clear()
                cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued)

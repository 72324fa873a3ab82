"""A de-duplicating work queue of jobs to reconcile (the shape of client-go's workqueue).

kopf delivers every watch event; many events of one job mean one more reconcile, not many. A key is
in the queue at most once; a key added while a worker reconciles it is queued again when that worker
is done, so no event is lost and no job is reconciled twice at the same time. Events no longer wait
in an executor holding their bodies: at 1,000 jobs that backlog was most of the operator's memory.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

Key = tuple[str, str]  # (namespace, name)


class WorkQueue:
    """FIFO of keys, each queued at most once and processed by one worker at a time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[Key] = deque()
        self._queued: set[Key] = set()
        self._processing: set[Key] = set()
        self._dirty: set[Key] = set()
        self._done_at: dict[Key, float] = {}
        self._closed = False

    def add(self, key: Key) -> None:
        with self._cond:
            if key in self._processing:
                self._dirty.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()

    def get(self, timeout: float | None = None) -> Key | None:
        """The next key (now being processed), or None when closed or after `timeout` seconds."""
        with self._cond:
            deadline = None if timeout is None else self._clock() + timeout
            while not self._queue and not self._closed:
                remaining = None if deadline is None else deadline - self._clock()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._closed:
                return None
            key = self._queue.popleft()
            self._queued.discard(key)
            self._processing.add(key)
            return key

    def done(self, key: Key) -> None:
        """The worker finished `key`; queue it again if it was added meanwhile."""
        with self._cond:
            self._processing.discard(key)
            self._done_at[key] = self._clock()
            if key in self._dirty:
                self._dirty.discard(key)
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()

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
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

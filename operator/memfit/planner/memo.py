"""A small memo of planner results for identical inputs.

`plan` is pure and deterministic, so two jobs with the same spec, profile and measurements planned
against the same pools and the same capacity snapshot get the same answer. The operator plans against
a shared capacity snapshot that lives about a second (controller.world_cache); a burst of identical jobs
(a sweep, a job array) would run the same search once per job within it. The memo answers those from
the first run. Inputs compared by value are folded into `key`; the large shared ones (the pools, the
capacity snapshot, the catalog) by identity: the entry holds them, so their ids cannot be reused while it
lives. A changed snapshot (new object) or any changed value misses.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class PlanMemo(Generic[T]):
    """Least-recently-used results keyed by (value key, identities of the shared inputs); thread-safe."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], tuple[tuple[object, ...], T]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, shared: tuple[object, ...], compute: Callable[[], T]) -> T:
        full = (key, tuple(id(o) for o in shared))
        with self._lock:
            entry = self._entries.get(full)
            if entry is not None and all(a is b for a, b in zip(entry[0], shared, strict=True)):
                self._entries.move_to_end(full)
                self.hits += 1
                return entry[1]
            self.misses += 1
        value = compute()
        with self._lock:
            self._entries[full] = (shared, value)
            self._entries.move_to_end(full)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

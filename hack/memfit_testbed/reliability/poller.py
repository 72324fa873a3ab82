"""A harness thread that lists cluster objects every `interval` seconds and hands them to `observe`.

Shared by the campaign's own witnesses (NodeReadiness, GpuOccupancy): a poll that fails (the API server
busy or down, as the campaign makes it) is skipped, and nothing seen is what that poll records.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

from memfit_testbed.cluster_helpers import Kube

Obj = dict[str, Any]


@dataclass
class Poller:
    """Subclasses say what to list (`poll`) and what to keep of it (`observe`)."""

    kube: Kube
    interval: float = 0.5
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                lists = self.poll()
            except Exception:  # the API server is busy or down: nothing seen this time
                continue
            self.observe(*lists, datetime.now(UTC))

    def _list(self, call: Any) -> list[Obj]:
        return list((Kube.raw(call, _request_timeout=5) or {}).get("items") or [])

    def poll(self) -> tuple[list[Obj], ...]:
        raise NotImplementedError

    def observe(self, *args: Any) -> None:
        raise NotImplementedError

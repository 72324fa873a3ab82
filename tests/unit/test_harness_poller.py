"""The campaign's witnesses poll on a thread; a failed poll (API server down) is skipped, not fatal."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memfit_testbed.reliability.poller import Obj, Poller


@dataclass
class Counting(Poller):
    polls: int = 0
    seen: list[tuple[list[Obj], datetime]] = field(default_factory=list)
    enough: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> tuple[list[Obj]]:
        self.polls += 1
        if self.polls % 2:
            raise ConnectionError("API server down")
        return ([{"n": self.polls}],)

    def observe(self, *args: Any) -> None:
        items, now = args
        self.seen.append((items, now))
        if len(self.seen) >= 3:
            self.enough.set()


def test_failed_polls_are_skipped_and_the_others_observed() -> None:
    p = Counting(kube=None, interval=0.01).start()  # type: ignore[arg-type]  # poll() is the subclass's
    assert p.enough.wait(10)
    p.stop()
    assert [items for items, _ in p.seen[:3]] == [[{"n": 2}], [{"n": 4}], [{"n": 6}]]
    assert all(isinstance(now, datetime) for _, now in p.seen)

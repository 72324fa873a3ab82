"""Events are posted in the background, dropped (and counted) when the queue is full."""

from __future__ import annotations

import threading
from typing import Any

from memfit.controller.events import EventPoster


class RecordingApi:
    def __init__(self, fail: bool = False) -> None:
        self.events: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.fail = fail

    def create_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if len(self.events) == 3:
            self.done.set()
        if self.fail:
            raise RuntimeError("API server unreachable")


def event(reason: str) -> dict[str, Any]:
    return {"reason": reason, "metadata": {"namespace": "ns"}}


def test_events_are_posted_in_the_background_even_after_errors() -> None:
    api = RecordingApi(fail=True)
    poster = EventPoster()
    poster.start(api, threads=1)  # type: ignore[arg-type]
    for reason in ("ProfileCached", "PlanFound", "TrainingSucceeded"):
        poster.post(event(reason))
    assert api.done.wait(5)
    poster.stop()
    assert [e["reason"] for e in api.events] == ["ProfileCached", "PlanFound", "TrainingSucceeded"]


def test_a_full_queue_drops_and_counts() -> None:
    poster = EventPoster(capacity=2)  # not started: nothing drains it
    for reason in ("a", "b", "c", "d"):
        poster.post(event(reason))
    assert poster.dropped == 2

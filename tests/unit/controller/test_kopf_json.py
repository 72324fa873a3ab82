"""kopf's watch streams decode with orjson, giving what the standard library gives."""

from __future__ import annotations

import inspect
import json

import kopf._cogs.clients.api as kopf_api
from memfit.controller import kopf_json

EVENT = {"type": "MODIFIED", "object": {
    "apiVersion": "memfit.dev/v1alpha1", "kind": "MemoryOptimizedTrainingJob",
    "metadata": {"name": "j", "namespace": "n", "uid": "0b1c", "resourceVersion": "123456789", "generation": 2,
                 "labels": {"a": "b"}, "annotations": {"note": "ünïcode ✓"}},
    "spec": {"training": {"learningRate": 0.0003, "maxSteps": 100, "globalBatchSize": 64}, "flags": [True, None]},
    "status": {"conditions": [], "attempts": [{"index": 0, "measuredPeakBytes": 85899345920}]},
}}


def test_kopf_still_reads_each_event_line_with_json_loads() -> None:
    """The swap relies on this line of kopf's `stream`; an upgrade that changes it shows here."""
    assert "json.loads(line.decode(" in inspect.getsource(kopf_api.stream)


def test_the_swap_decodes_watch_lines_as_the_standard_library_does_and_is_idempotent() -> None:
    before = kopf_api.json
    try:
        assert kopf_json.decode_watch_events_with_orjson() and kopf_json.decode_watch_events_with_orjson()
        line = json.dumps(EVENT, ensure_ascii=False)
        assert kopf_api.json.loads is kopf_json._loads
        assert kopf_api.json.loads(line) == json.loads(line) == EVENT
        assert kopf_api.json.dumps is json.dumps  # everything else is the standard library's
    finally:
        kopf_api.json = before  # type: ignore[attr-defined]


def test_nothing_is_swapped_when_kopf_reads_json_some_other_way() -> None:
    before = kopf_api.json
    try:
        kopf_api.json = object()  # type: ignore[attr-defined]
        assert not kopf_json.decode_watch_events_with_orjson()
    finally:
        kopf_api.json = before  # type: ignore[attr-defined]

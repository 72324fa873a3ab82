"""A MOTJ's spec parsed once per generation, not once per reconcile pass.

Every pass parses the job's spec into the API models (pydantic validation and the cross-field rules): at
1,000 jobs that was a thirtieth of the operator's CPU (py-spy during benchmarks/scale.py), although a
job's spec changes only when its `metadata.generation` does (the API server bumps it on every spec change
of a custom resource with a status subresource). The API models are frozen, so one parsed value serves
every pass. (The status is parsed each pass: it changes with most of them, and keeping parsed statuses
of 1,000 jobs, 14 KB each, cost 70 MB of the operator's memory for a seventieth of its CPU.)

A body without a uid or generation (a test's hand-made object) is parsed each time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.lifecycle.snapshot import parse_spec

T = TypeVar("T")
KEEP = 2048  # parsed specs kept (least recently used dropped), about 9 KB each


class _Recent(Generic[T]):
    """A thread-safe bounded map from a version key to its parsed value."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._values: OrderedDict[Hashable, T] = OrderedDict()

    def get_or_parse(self, key: Hashable | None, parse: Callable[[], T]) -> T:
        if key is None:
            return parse()
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = parse()
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._keep:
                self._values.popitem(last=False)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)


SpecParse = tuple[MemoryOptimizedTrainingJobSpec | None, tuple[str, ...]]
_SPECS: _Recent[SpecParse] = _Recent()


def spec_of(meta: Mapping[str, Any], raw: Mapping[str, Any] | None) -> SpecParse:
    """`parse_spec` of this generation of the job (its problems as a tuple)."""
    uid, generation = meta.get("uid"), meta.get("generation")
    key = (uid, generation, meta.get("name")) if uid and generation is not None else None

    def parse() -> SpecParse:
        spec, problems = parse_spec(str(meta["name"]), raw)
        return spec, tuple(problems)

    return _SPECS.get_or_parse(key, parse)


"""Read rank 0's progress series from a trainer's Prometheus endpoint (the operator's only pod I/O).

The trainer never writes to the API server: the operator reads `/metrics` over the pod network, as
Prometheus does, with a short timeout so that a slow pod never holds up a reconcile for long.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from memfit.lifecycle.progress import SERIES

TIMEOUT_SECONDS = 2.0
MAX_BYTES = 1 << 20  # a trainer serves a few KiB; never read an unbounded body into a reconcile
log = logging.getLogger(__name__)


def parse_trainer_metrics(text: str, *, job: str, rank: str = "0") -> dict[str, float] | None:
    """The progress series of `job`'s `rank` (name -> value) from exposition text; None when the
    endpoint serves another job (or no memfit trainer)."""
    values: dict[str, float] = {}
    seen_job = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in SERIES:
                continue
            if sample.labels.get("job") != job or sample.labels.get("rank") != rank:
                continue
            seen_job = True
            values[sample.name] = float(sample.value)
    return values if seen_job else None


def read_trainer_metrics(url: str, *, job: str) -> dict[str, float] | None:
    """GET `url` and parse it; None (logged at debug) when the trainer is not reachable yet."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            text = response.read(MAX_BYTES).decode("utf-8", errors="replace")
    except (OSError, urllib.error.URLError, ValueError) as error:
        log.debug("trainer metrics %s: %s", url, error)
        return None
    try:
        return parse_trainer_metrics(text, job=job)
    except ValueError as error:  # not Prometheus text
        log.debug("trainer metrics %s: %s", url, error)
        return None

"""The API server's own request counters (`apiserver_request_total`, watches left out), read before and
after a scenario: how many requests of each verb and resource the scenario cost the control plane, from
every client (the operator, the Job controller, the scheduler, KWOK). benchmarks/scale.py reports them per
job beside the bare client's writes."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kubernetes import client

Counts = Counter[tuple[str, str]]
_LINE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def request_counts(api_client: client.ApiClient) -> Counts:
    """(verb, resource[/subresource]) -> requests served so far (WATCH and WATCHLIST excluded)."""
    url = api_client.configuration.host.rstrip("/") + "/metrics"
    response: Any = api_client.rest_client.pool_manager.request("GET", url, timeout=30)
    if response.status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {response.status}")
    counts: Counts = Counter()
    for line in response.data.decode().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        verb = labels.get("verb", "")
        if verb.startswith("WATCH"):
            continue
        resource = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        counts[(verb, resource)] += int(float(match["value"]))
    return counts


def per_job(before: Counts, after: Counts, jobs: int, top: int = 12) -> dict[str, Any]:
    """Requests per job between two reads: the total and the largest (verb, resource) rows."""
    delta = Counter({k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0})
    total = sum(delta.values())
    return {
        "total_per_job": round(total / jobs, 1) if jobs else None,
        "largest_per_job": {f"{verb} {resource}": round(n / jobs, 2) for (verb, resource), n in delta.most_common(top)},
    }

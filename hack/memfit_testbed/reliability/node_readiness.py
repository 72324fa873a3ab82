"""When each pool's nodes were not Ready, seen by polling the Nodes (API outages included).

The API server outages of the reliability campaign can outlast the node controller's grace period:
KWOK cannot renew the node leases while the API server is down, so kube-controller-manager marks
the nodes NotReady when it is back ("all Nodes are not-Ready. Entering master disruption mode") and
the scheduler places nothing on them until KWOK's next heartbeat. A job whose pods waited through
such a window longer than its `capacityTimeoutSeconds` is re-planned with outcome NoCapacity, as
documented; `NodeReadiness` lets the harness tell that from a wrong re-plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memfit.lifecycle.capacity import node_ready

from memfit_testbed.kwok_pools import POOL_LABEL
from memfit_testbed.reliability.poller import Obj, Poller


@dataclass
class NodeReadiness(Poller):
    """Polls every `interval` seconds; a pool is disrupted from the first poll that sees one of its
    nodes not ready by memfit's own rule (`node_ready`: Ready and schedulable, what its capacity view
    counts) to the first that sees all of them ready again."""

    windows: dict[str, list[tuple[datetime, datetime | None]]] = field(default_factory=dict)

    def poll(self) -> tuple[list[Obj]]:
        return (self._list(self.kube.core.list_node),)

    def observe(self, nodes: list[dict[str, Any]], now: datetime) -> None:
        down: set[str] = set()
        pools: set[str] = set()
        for node in nodes:
            pool = (node["metadata"].get("labels") or {}).get(POOL_LABEL)
            if not pool:
                continue
            pools.add(pool)
            if not node_ready(node):
                down.add(pool)
        with self._lock:
            for pool in pools:
                spans = self.windows.setdefault(pool, [])
                open_span = bool(spans) and spans[-1][1] is None
                if pool in down and not open_span:
                    spans.append((now, None))
                elif pool not in down and open_span:
                    spans[-1] = (spans[-1][0], now)

    def disrupted(self, pool: str, start: datetime, end: datetime) -> bool:
        """Whether some node of `pool` was seen not Ready between `start` and `end`."""
        with self._lock:
            spans = list(self.windows.get(pool, []))
        return any(s <= end and (e is None or e >= start) for s, e in spans)

    def summary(self) -> dict[str, list[list[str]]]:
        """pool -> [[from, to], ...] in UTC (to: "" while still not Ready)."""
        with self._lock:
            return {
                pool: [[s.strftime("%H:%M:%S"), e.strftime("%H:%M:%S") if e else ""] for s, e in spans]
                for pool, spans in sorted(self.windows.items())
                if spans
            }

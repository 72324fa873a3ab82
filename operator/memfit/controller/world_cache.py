"""Observe what a plan needs from the cluster (lifecycle.World: pools and live capacity), and a
short-lived snapshot of it shared by the reconciles of one moment."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from memfit.api.pool import GPUNodePool
from memfit.controller.kubeapi import KubeApi
from memfit.lifecycle.capacity import observe_pools
from memfit.lifecycle.dra_capacity import DraInventory
from memfit.lifecycle.world import World

log = logging.getLogger(__name__)
Manifest = dict[str, Any]


def observe_world(
    api: KubeApi, *, nodes: list[Manifest] | None = None, pods: list[Manifest] | None = None
) -> World:
    """Read GPUNodePools and compute their capacity from Nodes and the Pods bound to them (both read
    now unless given)."""
    pools: list[GPUNodePool] = []
    for raw in api.list_pools():
        try:
            pools.append(GPUNodePool.model_validate(raw | {"status": None}))
        except ValidationError as error:
            log.warning("ignoring invalid GPUNodePool %s: %s", raw.get("metadata", {}).get("name"), error)
    nodes = api.list_nodes() if nodes is None else nodes
    dra = read_dra(api, pools)
    capacity = observe_pools(pools, nodes=nodes, pods=api.list_active_pods() if pods is None else pods, dra=dra)
    return World(tuple(sorted(pools, key=lambda p: p.metadata.name)), capacity,
                 device_classes=dra.device_classes if dra is not None else None)


def read_dra(api: KubeApi, pools: list[GPUNodePool]) -> DraInventory | None:
    """ResourceSlices, allocated claims and DeviceClasses, read only when a pool requests GPUs by DRA
    (None otherwise, or when the cluster does not serve resource.k8s.io/v1: its DRA pools' capacity is
    then unknown and their DeviceClass unchecked)."""
    if not any(p.spec.gpu.dra is not None for p in pools):
        return None
    try:
        return api.list_dra()
    except ApiException as error:
        log.warning("DRA pools: could not read resource.k8s.io/v1 (%s %s)", error.status, error.reason)
        return None


class WorldCache:
    """One observation of the world, reused for `ttl_seconds` by every reconcile that plans, and the
    Node list, reused for `node_ttl_seconds` (by plans and pool status).

    Listing every Node and Pod for each plan made 1,000 simultaneous jobs quadratic, and parsing 200
    Nodes once a second still cost a tenth of a core. Capacity is advisory anyway (pods not yet bound
    hold no GPU in it; an over-booked pool ends in the capacity timeout and a re-plan), so a snapshot
    a second old decides as well as a fresh one, and nodes come and go far more slowly than pods.
    """

    def __init__(
        self,
        ttl_seconds: float = 1.0,
        node_ttl_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.node_ttl_seconds = node_ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._world: World | None = None
        self._taken = 0.0
        self._nodes: list[Manifest] | None = None
        self._nodes_taken = 0.0
        self.observations = 0

    def get(self, api: KubeApi) -> World:
        with self._lock:  # one observer at a time; the others wait and share its result
            if self._world is None or self._clock() - self._taken >= self.ttl_seconds:
                self._world = observe_world(api, nodes=self._node_list(api))
                self._taken = self._clock()
                self.observations += 1
            return self._world

    def invalidate(self, *, nodes: bool = False) -> None:
        """Forget the snapshot (and the Node list with `nodes`): the next reconcile that plans observes
        again. A rank's node was just drained or lost: its re-plan must not see it as capacity."""
        with self._lock:
            self._world = None
            if nodes:
                self._nodes = None

    def nodes(self, api: KubeApi) -> list[Manifest]:
        with self._lock:
            return self._node_list(api)

    def source(self, api: KubeApi) -> Callable[[], World]:
        return lambda: self.get(api)

    def _node_list(self, api: KubeApi) -> list[Manifest]:
        if self._nodes is None or self._clock() - self._nodes_taken >= self.node_ttl_seconds:
            self._nodes = api.list_nodes()
            self._nodes_taken = self._clock()
        return self._nodes

"""Helpers for the integration tier: API clients, raw reads and waits that print component logs on timeout."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")
Obj = dict[str, Any]


@dataclass
class Kube:
    """API clients for one cluster, plus a function returning its component logs for failure messages."""

    api_client: client.ApiClient
    logs: Callable[[], str]

    # Typed as Any: tests pass manifests as dicts, which the client serialises as they are, while its
    # annotations ask for model objects.
    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api_client)

    @property
    def batch(self) -> Any:
        return client.BatchV1Api(self.api_client)

    def pod(self, ns: str, name: str) -> Obj | None:
        """The pod as a manifest-style dict (camelCase), or None if it does not exist."""
        return self.raw(self.core.read_namespaced_pod, name, ns)

    def pods(self, ns: str, selector: str = "") -> list[Obj]:
        resp = self.raw(self.core.list_namespaced_pod, ns, label_selector=selector)
        return list((resp or {}).get("items") or [])

    @staticmethod
    def raw(call: Any, *args: Any, **kwargs: Any) -> Obj | None:
        try:
            resp = call(*args, _preload_content=False, **kwargs)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(json.loads(resp.data))

    def wait(self, what: str, fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
        """Poll `fn` until it returns a truthy value; on timeout fail with the last value and the logs."""
        deadline, last = time.monotonic() + timeout, None
        while True:
            last = fn()
            if last:
                return last
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: "
                                     f"{json.dumps(last, default=str)[:3000]}\n{self.logs()}")
            time.sleep(interval)

    def wait_pod_phase(self, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60.0) -> Obj:
        def check() -> Obj | None:
            pod = self.pod(ns, name)
            return pod if pod and (pod.get("status") or {}).get("phase") in phases else None

        try:
            return self.wait(f"pod {ns}/{name} in {phases}", check, timeout)
        except AssertionError as e:
            now = json.dumps(self.pod(ns, name), default=str)[:4000]
            raise AssertionError(f"{e}\npod now: {now}") from None


def terminated(pod: Obj, container: str | None = None) -> Obj:
    """The terminated state of `container` (default: the first) of `pod`."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    st = next(s for s in statuses if container is None or s["name"] == container)
    return dict(st["state"]["terminated"])


def condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)

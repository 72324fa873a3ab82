"""The `memfit.dev/memory-fit` AdmissionCheck controller: Kueue asks, memfit answers for Jobs it did
not launch. Read (admission/read.py) -> decide (lifecycle.admission.decide_workload) -> apply
(controller.reconcile.apply_writes, the MOTJ reconcile's own).

Every `interval` seconds, when some AdmissionCheck names the controller:
1. each such AdmissionCheck gets `Active=True` (Kueue keeps a ClusterQueue that lists an inactive
   check inactive);
2. each Workload with one of those checks `Pending` and quota reserved (a flavor assigned) gets the
   check's state and message, by server-side apply of its own entry of `status.admissionChecks`, and a
   Warning Event on its Job when the answer is not Ready.
Kueue then admits (all checks Ready), evicts and requeues (Retry) or deactivates (Rejected) it.
A poll, not a watch: a check is answered within `interval`, and the operator needs no Kueue watch
(kopf would fail without Kueue's CRDs or the read). Nothing is done without Kueue or the RBAC.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from memfit import metrics
from memfit.controller.admission.read import now_rfc3339, observe_pools, observe_workload, pending_checks
from memfit.controller.kubeapi import KubeApi
from memfit.controller.reconcile import apply_writes
from memfit.lifecycle.admission import decide_workload
from memfit.lifecycle.admission.memory_fit import CONTROLLER_NAME

log = logging.getLogger("memfit.admission")
Manifest = dict[str, Any]


def _active(check: Manifest) -> bool:
    conditions = (check.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


class MemoryFitController:
    def __init__(self, api: KubeApi, post_event: Callable[[Manifest], None] | None = None) -> None:
        self.api = api
        self.post_event = post_event  # the operator's EventPoster (None: post in this thread)

    def run_forever(self, stop: threading.Event, interval_seconds: float) -> None:
        while not stop.wait(interval_seconds):
            try:
                self.pass_once()
            except Exception as error:  # never crash the operator; the next pass retries
                metrics.RECONCILE_ERRORS.labels("AdmissionCheck").inc()
                log.warning("memory-fit admission check pass failed: %s", error)

    def pass_once(self) -> int:
        """Activate memfit's AdmissionChecks and answer their pending Workloads; how many answered."""
        names = self._activate()
        if not names:
            return 0
        answered = 0
        pools = None
        for workload in self.api.list_all_workloads():
            pending = pending_checks(workload, names)
            if not pending:
                continue
            pools = pools if pools is not None else observe_pools(self.api)
            decision = decide_workload(observe_workload(self.api, workload, pending, pools))
            if decision is None:
                continue  # its Job not seen yet: the next pass looks again
            meta = workload["metadata"]
            apply_writes(self.api, meta["namespace"], decision.effects, post_event=self.post_event)
            metrics.ADMISSION_CHECKS.labels(decision.verdict.state).inc()
            log.info("memory-fit %s/%s: %s: %s", meta["namespace"], meta["name"], decision.verdict.state,
                     decision.verdict.message)
            answered += 1
        return answered

    def _activate(self) -> set[str]:
        """memfit's AdmissionChecks, each marked Active once."""
        names = set()
        for check in self.api.list_admission_checks():
            if (check.get("spec") or {}).get("controllerName") != CONTROLLER_NAME:
                continue
            name = check["metadata"]["name"]
            names.add(name)
            if not _active(check):
                self.api.apply_admission_check_status(name, [{
                    "type": "Active", "status": "True", "reason": "Active", "lastTransitionTime": now_rfc3339(),
                    "message": "memfit's memory-fit controller answers this check",
                    "observedGeneration": check["metadata"].get("generation", 0)}])
                log.info("AdmissionCheck %s is active", name)
        return names

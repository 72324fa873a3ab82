"""Pods that wait for their PersistentVolumeClaims are not short of capacity: no re-plan, a condition
naming the claims, and the capacity wait counted only from when a GPU is what they lack."""

from __future__ import annotations

import pytest
from lifecycle_harness import T0, Harness, quickstart
from memfit.api.job import AttemptOutcome, Phase
from memfit.lifecycle.observed import claim_wait

UNBOUND = ("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes "
           "are available: 3 Preemption is not helpful for scheduling.")
NOT_FOUND = ('0/3 nodes are available: persistentvolumeclaim "j-checkpoints" not found. preemption: 0/3 nodes '
             'are available: 3 Preemption is not helpful for scheduling.')
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

WAITS = {
    "unbound immediate claim": (UNBOUND, True),
    "claim not seen yet (API server restart)": (NOT_FOUND, True),
    "ephemeral claim not created yet": (
        'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"', True),
    "no GPU": (NO_GPU, False),
    "claim being deleted": ('persistentvolumeclaim "j-checkpoints" is being deleted', False),
    "no volume fits on any node": ("0/3 nodes are available: 3 node(s) didn't find available persistent volumes "
                                   "to bind.", False),
}


@pytest.mark.parametrize("case", WAITS, ids=list(WAITS))
def test_which_scheduler_messages_are_a_claim_wait(case: str) -> None:
    message, waits = WAITS[case]
    assert claim_wait(message) is waits


def launched() -> Harness:
    h = Harness(spec=quickstart(recovery={"maxReplans": 3, "capacityTimeoutSeconds": 60}))
    h.seed_profile()
    h.reconcile()
    assert h.stored.phase == Phase.LAUNCHING
    h.start("j-train-0")
    return h


@pytest.mark.parametrize("message", [UNBOUND, NOT_FOUND], ids=["unbound", "not found"])
def test_a_pod_waiting_for_its_claim_past_the_capacity_timeout_is_not_replanned(message: str) -> None:
    h = launched()
    h.unschedulable("j-train-0", since=T0, message=message, claims=("j-checkpoints",))
    h.later(600)  # ten capacity timeouts
    decision = h.reconcile()
    assert "NoCapacity" not in decision.reasons() and decision.effects == ()
    assert h.stored.phase == Phase.LAUNCHING and h.stored.attempts[0].outcome == AttemptOutcome.LAUNCHING
    status, reason, said = h.condition("Running")
    assert (status, reason) == ("False", "WaitingForVolume")
    assert "j-checkpoints to be bound" in said and "not counted as missing capacity" in said
    before = h.status
    h.later(30)
    h.reconcile()
    assert h.status == before  # waiting costs no status write per pass


def test_capacity_counts_from_when_the_bound_claim_left_the_pod_short_of_a_gpu() -> None:
    """The scheduler keeps PodScheduled's lastTransitionTime while the reason changes, so the pod's
    condition still says T0 when the claim is bound and no GPU is free at T0 + 90 s."""
    h = launched()
    h.unschedulable("j-train-0", since=T0, message=UNBOUND, claims=("j-checkpoints",))
    h.later(90)
    h.reconcile()
    assert h.condition("Running")[1] == "WaitingForVolume"
    h.unschedulable("j-train-0", since=T0, message=NO_GPU, claims=("j-checkpoints",))
    decision = h.reconcile()
    assert decision.reasons() == [] and h.condition("Running")[1] == "PodsPending"
    assert h.stored.attempts[0].capacity_wait_since == h.now
    h.later(59)
    assert "NoCapacity" not in h.reconcile().reasons()
    h.later(1)
    assert h.reconcile().reasons() == ["NoCapacity"]
    assert h.stored.attempts[0].outcome == AttemptOutcome.NO_CAPACITY


def test_a_pod_that_runs_once_its_claim_is_bound_shows_running() -> None:
    h = launched()
    h.unschedulable("j-train-0", since=T0, message=UNBOUND, claims=("j-checkpoints",))
    h.reconcile()
    h.add_pod("j-train-0")
    h.reconcile()
    assert h.condition("Running")[:2] == ("True", "PodsRunning") and h.stored.phase == Phase.RUNNING


def test_a_profiling_pod_waiting_for_its_claim_is_not_placed_again() -> None:
    h = Harness(spec=quickstart(profiling={"timeoutSeconds": 300},
                                recovery={"maxReplans": 3, "capacityTimeoutSeconds": 60}))
    h.reconcile()
    h.unschedulable("j-profile", since=T0, message=UNBOUND, claims=("model",))
    h.later(120)
    decision = h.reconcile()
    assert decision.effects == () and "ProfilingRescheduled" not in decision.reasons()

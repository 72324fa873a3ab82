"""A Failed job gives its GPUs back: its unfinished training or profiling Job is deleted in the pass after
Failed is stored, once, with an Event and a note in the MESSAGE column; finished children stay."""

from __future__ import annotations

from typing import Any

from lifecycle_harness import Harness, quickstart
from memfit.api.job import Phase
from test_decide import launched


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "trainer", "image": "memfit-trainer:absent",
                                   "state": {"waiting": {"reason": reason, "message": message}}}]}


def _secret_missing(h: Harness) -> None:
    init = {"name": "fetch-model", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                         "message": 'secret "hf-token" not found'}}}  # fmt: skip
    h.add_pod("j-train-0", phase="Pending", initContainerStatuses=[init])


def test_a_job_failed_on_a_stuck_pod_deletes_its_training_job_in_the_next_pass() -> None:
    h = launched(recovery={"capacityTimeoutSeconds": 60})
    h.start("j-train-0")
    h.add_pod("j-train-0", phase="Pending", **waiting("ImagePullBackOff", "Back-off pulling image"))
    h.reconcile()
    h.later(61)
    failing = h.reconcile()
    # The pass that stores Failed deletes nothing (a crash before the status write would relaunch it)...
    assert h.stored.phase == Phase.FAILED and "delete Job/j-train-0" not in h.writes
    assert failing.requeue, "the release pass must run at once, not at the next resync"
    release = h.reconcile()
    # ... the next one does, says so once, and keeps the record.
    assert h.writes.count("delete Job/j-train-0") == 1 and not h.pods
    assert release.reasons() == ["GPUsReleased"] and "j-train-0" in release.events[0].message
    assert "GPUs released: j-train-0 deleted" in h.stored.message
    assert h.condition("Failed")[1] == "ImageUnavailable" and ("ConfigMap", "j-plan-0") in h.objects
    again = h.reconcile()
    assert again.effects == () and again.events == () and not again.requeue


def test_a_missing_secret_failure_releases_the_gpu_too() -> None:
    h = launched(recovery={"capacityTimeoutSeconds": 60})
    h.start("j-train-0")
    _secret_missing(h)
    h.reconcile()
    assert h.stored.message.startswith("ContainerConfigError: "), h.stored.message  # MESSAGE says what blocks
    h.later(61)
    h.reconcile()
    h.reconcile()
    assert ("Job", "j-train-0") not in h.objects and h.stored.phase == Phase.FAILED


def test_a_finished_training_job_of_a_failed_job_is_kept_for_inspection() -> None:
    h = launched()
    h.start("j-train-0")
    h.add_pod("j-train-0", phase="Failed")
    h.finish("j-train-0", failed=True, reason="BackoffLimitExceeded", message="Job has reached the backoff limit")
    h.reconcile()
    assert h.stored.phase == Phase.FAILED
    decision = h.reconcile()
    assert ("Job", "j-train-0") in h.objects and decision.effects == () and decision.events == ()


def test_a_spec_made_invalid_while_running_fails_the_job_and_releases_its_pods() -> None:
    h = launched()
    h.start("j-train-0")
    h.add_pod("j-train-0")
    h.reconcile()
    h.spec = quickstart(training={"globalBatchSize": -1})
    h.reconcile()
    assert h.stored.phase == Phase.FAILED and h.condition("Failed")[1] == "InvalidSpec"
    h.reconcile()
    assert ("Job", "j-train-0") not in h.objects


def test_a_succeeded_job_reads_and_deletes_nothing() -> None:
    h = launched()
    h.start("j-train-0")
    h.finish("j-train-0")
    h.reconcile()
    assert h.stored.phase == Phase.SUCCEEDED
    decision = h.reconcile()
    assert decision.effects == () and ("Job", "j-train-0") in h.objects and not decision.requeue


def test_the_message_shows_what_blocks_then_the_plan_again() -> None:
    h = launched(recovery={"capacityTimeoutSeconds": 600})
    planned = h.condition("Planned")[2]
    h.start("j-train-0")
    _secret_missing(h)
    h.reconcile()
    assert h.stored.message == "ContainerConfigError: pod j-train-0-0 cannot start: secret \"hf-token\" not found (gives up after 600s)"
    h.pods.clear()
    h.add_pod("j-train-0", phase="Pending")  # the Secret was created: the pod starts
    h.reconcile()
    assert h.stored.message == planned and h.condition("Running")[1] == "Launching"


def test_a_running_job_whose_replacement_pod_was_blocked_gets_running_true_back() -> None:
    h = launched(recovery={"capacityTimeoutSeconds": 600})
    h.start("j-train-0")
    h.add_pod("j-train-0")
    h.reconcile()
    assert h.condition("Running")[:2] == ("True", "PodsRunning")
    h.pods.clear()
    _secret_missing(h)  # the replacement pod waits for a Secret
    h.reconcile()
    assert h.condition("Running")[:2] == ("False", "ContainerConfigError")
    h.pods.clear()
    h.add_pod("j-train-0")  # the Secret exists: it runs again
    decision = h.reconcile()
    assert h.condition("Running")[:2] == ("True", "PodsRunning") and h.stored.message.startswith("1 training pod(s)")
    assert "PodsRunning" not in decision.reasons(), "the attempt was already Running: no second event"
    assert h.reconcile().effects == () and h.reconcile().status == decision.status


def test_a_profiling_pod_that_was_blocked_shows_profiling_again() -> None:
    h = Harness(spec=quickstart())
    h.reconcile()
    h.start("j-profile")
    init = {"name": "profiler", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                      "message": 'secret "hf-token" not found'}}}  # fmt: skip
    h.add_pod("j-profile", phase="Pending", containerStatuses=[init])
    h.reconcile()
    assert h.condition("Profiled")[1] == "ContainerConfigError"
    assert h.stored.message.startswith("ContainerConfigError: profiling pod j-profile-0")
    h.pods.clear()
    h.add_pod("j-profile")
    h.reconcile()
    assert h.condition("Profiled")[:2] == ("False", "Profiling") and h.stored.message.startswith("profiling on pool")


def test_a_spec_edited_after_success_leaves_the_job_succeeded() -> None:
    h = launched()
    h.start("j-train-0")
    h.finish("j-train-0")
    h.reconcile()
    assert h.stored.phase == Phase.SUCCEEDED
    h.spec = quickstart(training={"globalBatchSize": -1})
    decision = h.reconcile()
    assert h.stored.phase == Phase.SUCCEEDED and decision.events == () and not decision.requeue

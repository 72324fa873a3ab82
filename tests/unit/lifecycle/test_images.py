"""An image that cannot start gets a condition naming the image and the cause, never a silent wait;
a container that dies before writing a termination message is named with its exit code and image."""

from __future__ import annotations

from typing import Any

from lifecycle_harness import Harness, quickstart, terminated
from memfit.api.job import Phase
from test_decide import launched

IMAGE = "registry.invalid/memfit-trainer:missing"


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {"containerStatuses": [{"name": "c", "image": IMAGE, "state": {"waiting": {"reason": reason,
                                                                                      "message": message}}}]}


def test_an_image_never_pulled_and_absent_fails_the_attempt_at_once() -> None:
    h = launched()
    h.start("j-train-0")
    h.add_pod("j-train-0", phase="Pending",
              **waiting("ErrImageNeverPull", f'Container image "{IMAGE}" is not present with pull policy of Never'))
    decision = h.reconcile()
    assert h.stored.phase == Phase.FAILED
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "ImageUnavailable")
    assert IMAGE in message and "ErrImageNeverPull" in message and "pull policy of Never" in message
    assert "ImageUnavailable" in decision.reasons()


def test_a_failing_pull_is_shown_then_fails_after_the_capacity_timeout() -> None:
    h = launched(recovery={"capacityTimeoutSeconds": 300})
    h.start("j-train-0")
    h.add_pod("j-train-0", phase="Pending", **waiting("ImagePullBackOff", "Back-off pulling image"))
    decision = h.reconcile()
    assert h.stored.phase != Phase.FAILED
    status, reason, message = h.condition("Running")
    assert (status, reason) == ("False", "ImagePullFailing")
    assert IMAGE in message and "ImagePullBackOff" in message and "300s" in message
    assert decision.reasons() == ["ImagePullFailing"]
    assert h.reconcile().events == ()  # shown once, not an event per reconcile
    h.later(301)
    h.reconcile()
    assert h.stored.phase == Phase.FAILED
    assert h.condition("Failed")[1] == "ImageUnavailable"


def test_a_profiling_image_that_cannot_start_fails_profiling_with_the_image() -> None:
    h = Harness(spec=quickstart())
    h.reconcile()
    h.start("j-profile")
    h.add_pod("j-profile", phase="Pending", **waiting("InvalidImageName", "invalid reference format"))
    h.reconcile()
    assert h.stored.phase == Phase.FAILED
    _, reason, message = h.condition("Failed")
    assert reason == "ImageUnavailable" and message.startswith("profiling pod j-profile-0 cannot start image")
    assert IMAGE in message


def test_a_container_that_dies_before_its_termination_message_is_named_with_its_image() -> None:
    h = launched()
    h.start("j-train-0")
    status = terminated(127, reason="Error")
    status["containerStatuses"][0]["image"] = IMAGE
    h.add_pod("j-train-0", phase="Failed", **status)
    h.finish("j-train-0", failed=True, reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")
    h.reconcile()
    _, reason, message = h.condition("Failed")
    assert reason == "TrainingFailed"
    assert f"exited 127 (Error) (image {IMAGE}) before writing a termination message" in message


def test_a_missing_token_secret_is_named_and_fails_after_the_capacity_timeout() -> None:
    """The kubelet cannot start a pod whose Secret is missing (CreateContainerConfigError, retried): the
    job says which field names it, and fails once that lasted capacityTimeoutSeconds."""
    h = launched(problem={"huggingface": {"model": "org/llama", "tokenSecretRef": {"name": "hf-token"},
                                          "initialize": "pretrained", "sequenceLength": 64,
                                          "config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                                     "num_hidden_layers": 2, "num_attention_heads": 4,
                                                     "vocab_size": 512}}},
                 recovery={"capacityTimeoutSeconds": 300})  # fmt: skip
    h.start("j-train-0")
    init = {"name": "fetch-model", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                         "message": 'secret "hf-token" not found'}}}  # fmt: skip
    h.add_pod("j-train-0", phase="Pending", initContainerStatuses=[init])
    decision = h.reconcile()
    status, reason, message = h.condition("Running")
    assert (status, reason) == ("False", "ContainerConfigError") and h.stored.phase != Phase.FAILED
    assert message.startswith("spec.problem.huggingface.tokenSecretRef: Secret ns/hf-token with key 'token'")
    assert 'secret "hf-token" not found' in message and "300s" in message
    assert decision.reasons() == ["ContainerConfigError"]
    assert h.reconcile().events == ()
    h.later(301)
    h.reconcile()
    assert h.stored.phase == Phase.FAILED and h.condition("Failed")[1] == "ContainerConfigError"


def test_an_init_container_whose_image_cannot_start_is_seen() -> None:
    """The download step (init container fetch-model) pulls first; while it cannot, the trainer container
    only shows PodInitializing: the job must still say why, and fail a permanent cause at once."""
    h = launched()
    h.start("j-train-0")
    init = {"name": "fetch-model", "image": IMAGE, "state": {"waiting": {
        "reason": "ErrImageNeverPull", "message": f'Container image "{IMAGE}" is not present'}}}  # fmt: skip
    main = {"name": "trainer", "image": IMAGE, "state": {"waiting": {"reason": "PodInitializing"}}}
    h.add_pod("j-train-0", phase="Pending", initContainerStatuses=[init], containerStatuses=[main])
    h.reconcile()
    assert h.stored.phase == Phase.FAILED
    _, reason, message = h.condition("Failed")
    assert reason == "ImageUnavailable" and IMAGE in message and "ErrImageNeverPull" in message


def test_a_replacement_pod_missing_its_secret_gets_its_own_timeout() -> None:
    """Timed from the pod's creation: a replacement pod an hour into the run is not failed at once."""
    from datetime import timedelta

    from lifecycle_harness import T0

    h = launched(recovery={"capacityTimeoutSeconds": 300})
    h.start("j-train-0")
    h.later(3600)
    init = {"name": "fetch-model", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                         "message": 'secret "hf-token" not found'}}}  # fmt: skip
    pod = h.add_pod("j-train-0", phase="Pending", initContainerStatuses=[init])
    h.pods[pod]["metadata"]["creationTimestamp"] = (T0 + timedelta(seconds=3590)).isoformat().replace("+00:00", "Z")
    h.reconcile()
    assert h.stored.phase != Phase.FAILED and h.condition("Running")[1] == "ContainerConfigError"
    h.later(300)
    h.reconcile()
    assert h.stored.phase == Phase.FAILED


def test_a_profiling_pod_missing_the_token_secret_is_named() -> None:
    problem = {"huggingface": {"model": "org/llama", "tokenSecretRef": {"name": "hf-token"}, "sequenceLength": 64}}
    h = Harness(spec=quickstart(problem=problem, recovery={"capacityTimeoutSeconds": 300}))
    h.reconcile()
    h.start("j-profile")
    h.add_pod("j-profile", phase="Pending", **{"containerStatuses": [{"name": "profiler", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "hf-token" not found'}}}]})  # fmt: skip
    h.reconcile()
    status, reason, message = h.condition("Profiled")
    assert (status, reason) == ("False", "ContainerConfigError") and h.stored.phase != Phase.FAILED
    assert message.startswith("profiling spec.problem.huggingface.tokenSecretRef: Secret ns/hf-token")
    h.later(301)
    h.reconcile()
    assert h.stored.phase == Phase.FAILED and h.condition("Failed")[1] == "ContainerConfigError"

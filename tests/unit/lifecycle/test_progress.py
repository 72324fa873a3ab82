"""status.progress (rank 0's metrics -> step, losses, throughput, ETA) and the CheckpointStorage decisions."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
from lifecycle_harness import T0, Harness, quickstart, terminated
from memfit.api.job import Phase
from memfit.lifecycle.progress import (
    final_progress,
    format_eta,
    pod_changes,
    progress_of,
    still_starting,
    trainer_sample,
)
from memfit.lifecycle.snapshot import PROGRESS_SECONDS, TrainerSample

RANK0 = {
    "memfit_trainer_step": 120.0,
    "memfit_trainer_loss": 2.5,
    "memfit_trainer_eval_loss": math.nan,  # no evaluation yet
    "memfit_trainer_tokens_per_second": 1000.0,
    "memfit_trainer_step_seconds_sum": 30.0,
    "memfit_trainer_step_seconds_count": 60.0,  # a resumed pod timed 60 of its steps
    "memfit_trainer_resumed_from_step": 60.0,
}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (60, "1m00s"), (245, "4m05s"), (3900, "1h05m"), (86400 + 4 * 3600 + 59, "1d04h")],
)
def test_eta_reads_in_its_two_largest_units(seconds: int, text: str) -> None:
    assert format_eta(seconds) == text


def test_progress_from_rank_0() -> None:
    sample = trainer_sample(RANK0, attempt=1)
    assert sample == TrainerSample(attempt=1, step=120, loss=2.5, eval_loss=None, tokens_per_second=1000.0,
                                   step_seconds_sum=30.0, step_count=60, resumed_from_step=60)  # fmt: skip
    progress = progress_of(sample, max_steps=1000, data_parallel=4, now=T0)
    assert (progress.step, progress.max_steps, progress.steps) == (120, 1000, "120/1000")
    assert progress.loss == 2.5 and progress.eval_loss is None
    assert progress.tokens_per_second == 4000.0  # rank 0's rate x 4 data-parallel ranks
    assert progress.step_seconds == 0.5
    assert (progress.eta_seconds, progress.eta) == (440, "7m20s")  # 880 steps left x 0.5 s
    assert progress.resumed_from_step == 60 and progress.attempt == 1 and progress.updated_at == T0


@pytest.mark.parametrize(
    ("changes", "check"),
    [
        pytest.param({"memfit_trainer_eval_loss": 2.75}, lambda p: p.eval_loss == 2.75, id="eval loss reported"),
        pytest.param({"memfit_trainer_resumed_from_step": -1.0}, lambda p: p.resumed_from_step is None,
                     id="started from scratch"),
        pytest.param({"memfit_trainer_step_seconds_count": 0.0}, lambda p: p.eta is None and p.step_seconds is None,
                     id="no step timed yet: no ETA"),
        pytest.param({"memfit_trainer_step": 1000.0}, lambda p: p.eta == "0s" and p.steps == "1000/1000",
                     id="finished"),
        pytest.param({"memfit_trainer_step": 0.0, "memfit_trainer_loss": 0.0, "memfit_trainer_step_seconds_count": 0.0,
                      "memfit_trainer_resumed_from_step": -1.0},
                     lambda p: p.step == 0 and p.loss is None and p.tokens_per_second is None,
                     id="before the first step"),
        pytest.param({"memfit_trainer_step": 0.0, "memfit_trainer_loss": 0.0, "memfit_trainer_step_seconds_count": 0.0},
                     lambda p: p.step == 60 and p.resumed_from_step == 60 and p.loss is None,
                     id="resumed, before its first step: at the checkpoint's step"),
    ],
)  # fmt: skip
def test_progress_edge_cases(changes: dict[str, float], check: object) -> None:
    sample = trainer_sample(RANK0 | changes, attempt=0)
    assert sample is not None
    assert check(progress_of(sample, max_steps=1000, data_parallel=1, now=T0))  # type: ignore[operator]


def test_no_step_series_is_no_sample() -> None:
    assert trainer_sample({"memfit_trainer_loss": 1.0}, attempt=0) is None
    assert trainer_sample({"memfit_trainer_step": math.nan}, attempt=0) is None


# --- through decide ---------------------------------------------------------------------------------
def _running(h: Harness) -> str:
    h.seed_profile()
    h.reconcile()
    h.start("j-train-0")
    pod = h.add_pod("j-train-0", podIP="10.1.2.3")
    h.pods[pod]["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": "0"}
    return pod


def test_running_job_shows_progress_refreshed_every_15_seconds() -> None:
    h = Harness(spec=quickstart(training={"globalBatchSize": 8, "maxSteps": 200}))
    _running(h)
    h.metrics = dict(RANK0)
    h.reconcile()
    first = h.stored.progress
    assert first is not None and first.steps == "120/200" and first.updated_at == T0
    assert h.stored.phase == Phase.RUNNING
    # Within 15 s the metrics are not read again: the status does not change (no write).
    h.metrics = RANK0 | {"memfit_trainer_step": 130.0}
    h.later(PROGRESS_SECONDS - 1)
    decision = h.reconcile()
    assert decision.effects == () and h.stored.progress == first
    h.later(1)
    h.reconcile()
    second = h.stored.progress
    assert second is not None and second.step == 130 and second.updated_at == T0 + timedelta(seconds=PROGRESS_SECONDS)


def test_unreachable_metrics_keep_the_last_progress() -> None:
    h = Harness()
    _running(h)
    h.metrics = None
    h.reconcile()
    assert h.stored.progress is None


def test_success_shows_the_job_finished() -> None:
    h = Harness(spec=quickstart(training={"globalBatchSize": 8, "maxSteps": 200}))
    _running(h)
    h.metrics = dict(RANK0)
    h.reconcile()
    h.finish("j-train-0")
    h.reconcile()
    progress = h.stored.progress
    assert h.stored.phase == Phase.SUCCEEDED
    assert progress is not None and (progress.step, progress.steps, progress.eta) == (200, "200/200", "0s")


def test_a_job_that_ends_between_two_reads_shows_its_rate_from_the_completed_message() -> None:
    """A short run can finish before the first read (reads are 15 s apart): rank 0's Completed message
    (final loss, mean step time, whole-job tokens/s) is the progress the status and the gauges show."""
    h = Harness(spec=quickstart(training={"globalBatchSize": 8, "maxSteps": 200}))
    pod = _running(h)
    h.metrics = None  # never read while it ran
    h.reconcile()
    assert h.stored.progress is None
    done = {"reason": "Completed", "rank": 0, "steps": 200, "peakBytes": 1000, "finalLoss": 1.25,
            "stepSeconds": 0.125, "tokensPerSecond": 4096.0, "memoryMeter": "cpu-allocator"}  # fmt: skip
    h.pods[pod]["status"] = {"phase": "Succeeded", **terminated(0, json.dumps(done), reason="Completed")}
    h.finish("j-train-0")
    h.reconcile()
    progress = h.stored.progress
    assert h.stored.phase == Phase.SUCCEEDED
    assert progress is not None and (progress.step, progress.steps, progress.eta) == (200, "200/200", "0s")
    assert (progress.loss, progress.step_seconds, progress.tokens_per_second) == (1.25, 0.125, 4096.0)


def test_final_progress_of_a_new_attempt_does_not_inherit_the_last_ones_numbers() -> None:
    earlier = progress_of(trainer_sample(RANK0, attempt=0), max_steps=1000, data_parallel=2, now=T0)  # type: ignore[arg-type]
    assert earlier.resumed_from_step == 60 and earlier.tokens_per_second is not None
    final = final_progress(earlier, {"reason": "Completed", "finalLoss": 0.5}, max_steps=1000, attempt=1, now=T0)
    assert (final.attempt, final.resumed_from_step, final.tokens_per_second, final.loss) == (1, None, None, 0.5)


def test_final_progress_keeps_what_an_older_trainer_did_not_report() -> None:
    read = progress_of(trainer_sample(RANK0, attempt=0), max_steps=1000, data_parallel=2, now=T0)  # type: ignore[arg-type]
    final = final_progress(read, {"reason": "Completed", "finalLoss": "nan?"}, max_steps=1000, attempt=0, now=T0)
    assert (final.step, final.eta_seconds, final.loss) == (1000, 0, read.loss)
    assert (final.tokens_per_second, final.step_seconds) == (read.tokens_per_second, read.step_seconds)


# --- checkpoint storage -------------------------------------------------------------------------------
def test_default_claim_is_created_and_recorded() -> None:
    h = Harness()
    h.seed_profile()
    h.reconcile()
    claim = h.objects[("PersistentVolumeClaim", "j-checkpoints")]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert h.stored.checkpoint_claim == "j-checkpoints"
    status, reason, message = h.condition("CheckpointStorage")
    # The settings' default access mode is ReadWriteOnce: the plan stays on one node, and says so.
    assert (status, reason) == ("True", "SingleNodeVolume")
    assert "the plan stays on one node (placement.maxNodes is 2)" in message
    assert h.plan_json(0)["nodes"] == 1


def test_a_missing_named_claim_creates_nothing_and_says_which_field() -> None:
    h = Harness(spec=quickstart(training={"globalBatchSize": 8, "checkpoint": {"volumeClaim": "ckpt"}}))
    h.seed_profile()
    decision = h.reconcile()
    assert not any(kind in ("Job", "PersistentVolumeClaim") for kind, _ in h.objects)
    status, reason, message = h.condition("CheckpointStorage")
    assert (status, reason) == ("False", "CheckpointClaimMissing")
    assert message.startswith("training.checkpoint.volumeClaim: PersistentVolumeClaim ns/ckpt does not exist")
    assert h.stored.phase == Phase.PLANNING
    assert [e.reason for e in decision.events][-1:] == ["CheckpointClaimMissing"]
    assert h.reconcile().events == ()  # no event storm while it stays missing
    # Once the claim exists (ReadWriteMany), the job launches on it; memfit creates no claim of its own.
    h.objects[("PersistentVolumeClaim", "ckpt")] = {"spec": {"accessModes": ["ReadWriteMany"]}}
    h.reconcile()
    assert ("Job", "j-train-0") in h.objects and ("PersistentVolumeClaim", "j-checkpoints") not in h.objects
    assert h.condition("CheckpointStorage")[:2] == ("True", "SharedVolume")
    assert h.stored.checkpoint_claim == "ckpt"


def test_empty_dir_only_when_asked_and_said() -> None:
    h = Harness(spec=quickstart(training={"globalBatchSize": 8, "checkpoint": {"emptyDir": True}}))
    h.seed_profile()
    h.reconcile()
    assert ("PersistentVolumeClaim", "j-checkpoints") not in h.objects and ("Job", "j-train-0") in h.objects
    assert h.condition("CheckpointStorage")[:2] == ("False", "EphemeralCheckpoints")
    assert h.stored.checkpoint_claim is None


def test_a_missing_model_data_or_output_claim_creates_nothing_and_says_which_field() -> None:
    """A pod mounting a claim that does not exist would stay Pending with only the scheduler's word for it:
    the job waits in Planning instead, naming the field and the claim, and starts once the claim exists."""
    spec = quickstart(
        problem={"huggingface": {"volumeClaim": "models", "path": "llama", "sequenceLength": 32,
                                 "config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                            "num_hidden_layers": 2, "num_attention_heads": 4,
                                            "num_key_value_heads": 2, "vocab_size": 400}}},
        data={"files": {"volumeClaim": "corpus", "path": "train.jsonl"}},
    )  # fmt: skip
    h = Harness(spec=spec)
    h.objects[("PersistentVolumeClaim", "models")] = {"spec": {"accessModes": ["ReadWriteMany"]}}
    decision = h.reconcile()
    assert not any(kind == "Job" for kind, _ in h.objects), list(h.objects)
    status, reason, message = h.condition("Planned")
    assert (status, reason) == ("False", "VolumeClaimMissing")
    assert message.startswith("spec.data.files.volumeClaim: PersistentVolumeClaim ns/corpus does not exist"), message
    assert "models" not in message and h.stored.phase == Phase.PLANNING
    assert [e.reason for e in decision.events] == ["VolumeClaimMissing"]
    assert h.reconcile().events == ()  # no event storm while it stays missing
    h.objects[("PersistentVolumeClaim", "corpus")] = {"spec": {"accessModes": ["ReadWriteMany"]}}
    h.reconcile()
    assert any(kind == "Job" for kind, _ in h.objects), list(h.objects)  # profiling (or training) starts
    assert h.condition("Planned")[1] != "VolumeClaimMissing"


# --- a replaced pod and a resume ---------------------------------------------------------------------
def test_a_replacement_pod_never_shows_step_0_and_its_resume_is_an_event() -> None:
    h = Harness(spec=quickstart(training={"globalBatchSize": 8, "maxSteps": 3000}))
    pod = _running(h)
    h.metrics = RANK0 | {"memfit_trainer_resumed_from_step": -1.0}
    h.reconcile()
    assert h.stored.progress is not None and h.stored.progress.steps == "120/3000"
    assert h.stored.progress.pod == pod
    # The pod is replaced; the new one serves step 0 before it loaded the checkpoint.
    del h.pods[pod]
    h.add_pod("j-train-0", 0, podIP="10.1.2.4")
    h.pods["j-train-0-0"]["metadata"].update(name="j-train-0-0-b",
                                             annotations={"batch.kubernetes.io/job-completion-index": "0"})
    h.pods["j-train-0-0-b"] = h.pods.pop("j-train-0-0")
    h.metrics = {"memfit_trainer_step": 0.0, "memfit_trainer_loss": 0.0, "memfit_trainer_step_seconds_count": 0.0,
                 "memfit_trainer_resumed_from_step": -1.0}  # fmt: skip
    h.later(PROGRESS_SECONDS)
    quiet = h.reconcile()
    assert h.stored.progress is not None and h.stored.progress.steps == "120/3000", "never back to 0"
    assert quiet.events == ()
    # It loaded the checkpoint at step 100: one PodReplaced (warning) and one Resumed event, with the step.
    h.metrics = {"memfit_trainer_step": 100.0, "memfit_trainer_step_seconds_count": 0.0,
                 "memfit_trainer_resumed_from_step": 100.0}  # fmt: skip
    h.later(PROGRESS_SECONDS)
    decision = h.reconcile()
    assert decision.reasons() == ["PodReplaced", "Resumed"]
    replaced, resumed = decision.events
    assert replaced.type.value == "Warning" and pod in replaced.message and "j-train-0-0-b" in replaced.message
    assert "step 100" in replaced.message and "at step 120" in replaced.message
    assert "resumed from the checkpoint at step 100" in resumed.message
    progress = h.stored.progress
    assert progress is not None and (progress.steps, progress.resumed_from_step) == ("100/3000", 100)
    h.later(PROGRESS_SECONDS)
    assert h.reconcile().events == (), "said once"


def test_a_replacement_without_a_checkpoint_says_it_starts_again() -> None:
    previous = progress_of(trainer_sample(RANK0, attempt=0, pod="a"), max_steps=1000, data_parallel=1, now=T0)  # type: ignore[arg-type]
    fresh = trainer_sample({"memfit_trainer_step": 1.0, "memfit_trainer_step_seconds_count": 1.0}, attempt=0, pod="b")
    assert fresh is not None and not still_starting(fresh, previous)
    (reason, message, warning), = pod_changes(fresh, previous)
    assert (reason, warning) == ("PodReplaced", True) and "starts again at step 0" in message


def test_the_final_status_has_the_final_eval_loss_from_the_completed_message() -> None:
    read = progress_of(trainer_sample(RANK0 | {"memfit_trainer_eval_loss": 3.0}, attempt=0),  # type: ignore[arg-type]
                       max_steps=1000, data_parallel=1, now=T0)
    final = final_progress(read, {"reason": "Completed", "finalLoss": 1.0, "evalLoss": 1.5}, max_steps=1000,
                           attempt=0, now=T0)  # fmt: skip
    assert final.eval_loss == 1.5
    kept = final_progress(read, {"reason": "Completed", "finalLoss": 1.0}, max_steps=1000, attempt=0, now=T0)
    assert kept.eval_loss == 3.0

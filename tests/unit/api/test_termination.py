"""The termination contract: one definition read by the trainer, the Job builder and the observer."""

from __future__ import annotations

import json

import pytest
from factories import OWNER, PLACEMENT, POD, make_plan, make_spec
from memfit.api.termination import (
    EXIT_INVALID_PLAN,
    EXIT_MEMORY_OVER_PLAN,
    EXIT_OUT_OF_MEMORY,
    KEY_EVAL_LOSS,
    TerminationMessage,
    TerminationReason,
    out_of_memory_reason,
    parse_message,
)
from memfit.kube.train_job import build_training_job

OOM_CASES = {
    "CUDA OOM message": ({"reason": "CUDAOutOfMemory"}, 1, "", TerminationReason.CUDA_OUT_OF_MEMORY),
    "exit code 87 without a message": ({}, 87, "Error", TerminationReason.CUDA_OUT_OF_MEMORY),
    "kernel OOMKilled": ({}, 137, "OOMKilled", TerminationReason.HOST_OUT_OF_MEMORY),
    "host OOM message with exit 87": (
        {"reason": "HostOutOfMemory"},
        87,
        "",
        TerminationReason.HOST_OUT_OF_MEMORY,
    ),
    "invalid plan is no OOM": ({"reason": "InvalidPlan"}, 88, "Error", None),
    "plain crash is no OOM": ({}, 1, "Error", None),
}


@pytest.mark.parametrize("case", OOM_CASES, ids=list(OOM_CASES))
def test_out_of_memory_reason(case: str) -> None:
    message, code, container_reason, expected = OOM_CASES[case]
    assert out_of_memory_reason(message, exit_code=code, container_reason=container_reason) == expected


def test_training_job_fails_at_once_on_the_contract_exit_codes() -> None:
    job = build_training_job(owner=OWNER, spec=make_spec(), plan=make_plan(nodes=1), placement=PLACEMENT, pod=POD)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    fail_job = next(r for r in rules if r["action"] == "FailJob")
    assert fail_job["onExitCodes"]["values"] == [EXIT_OUT_OF_MEMORY, EXIT_INVALID_PLAN, EXIT_MEMORY_OVER_PLAN] \
        == [87, 88, 89]


def test_message_round_trips_through_the_observer_parser() -> None:
    wire = TerminationMessage(TerminationReason.CUDA_OUT_OF_MEMORY, rank=1, step=3, peak_bytes=7).to_json()
    assert parse_message(wire) == {"reason": "CUDAOutOfMemory", "rank": 1, "step": 3, "peakBytes": 7}
    assert parse_message("Traceback (most recent call last)") == {}
    assert parse_message(json.dumps([1])) == {}


def test_completed_message_carries_the_final_eval_loss_under_the_contract_key() -> None:
    wire = TerminationMessage(TerminationReason.COMPLETED, steps=6, final_loss=1.25, eval_loss=1.5).to_json()
    assert parse_message(wire)[KEY_EVAL_LOSS] == 1.5
    assert KEY_EVAL_LOSS not in parse_message(TerminationMessage(TerminationReason.COMPLETED, steps=6).to_json())


def test_pytorchs_own_words_in_a_scripts_last_log_lines_are_a_cuda_oom() -> None:
    """A user's script (spec.container) writes no JSON message: its log tail (FallbackToLogsOnError) is."""
    tail = ('  File "train.py", line 80, in <module>\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate '
            "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.")
    assert out_of_memory_reason({}, exit_code=1, container_reason="Error", text=tail) == (
        TerminationReason.CUDA_OUT_OF_MEMORY)
    assert out_of_memory_reason({}, exit_code=1, container_reason="Error", text="KeyError: 'labels'") is None
    assert out_of_memory_reason({}, exit_code=0, container_reason="Completed", text=tail) is None
    # memfit's own trainer's JSON message keeps its say.
    assert out_of_memory_reason({"reason": "TrainingError"}, exit_code=1, container_reason="Error", text=tail) is None

"""Exit codes and the termination-message schema the operator reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memfit_trainer.termination import (
    EXIT_INVALID_PLAN,
    EXIT_OUT_OF_MEMORY,
    MAX_MESSAGE_BYTES,
    Reason,
    TerminationMessage,
    exit_code,
    is_host_out_of_memory,
    read_termination_message,
    requested_bytes_from_error,
    write_termination_message,
)


def test_exit_codes_are_distinct_and_documented() -> None:
    codes = {reason: exit_code(reason) for reason in Reason}
    assert codes == {
        Reason.COMPLETED: 0,
        Reason.TRAINING_ERROR: 1,
        Reason.CUDA_OUT_OF_MEMORY: 87,
        Reason.HOST_OUT_OF_MEMORY: 87,
        Reason.INVALID_PLAN: 88,
        Reason.MEMORY_OVER_PLAN: 89,
    }
    assert (EXIT_OUT_OF_MEMORY, EXIT_INVALID_PLAN) == (87, 88)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trainer.md").read_text()
    for reason, code in codes.items():
        assert f"`{reason.value}`" in doc and f"| {code} " in doc, reason


def test_oom_message_wire_form_is_camel_case_without_nulls() -> None:
    message = TerminationMessage(
        reason=Reason.CUDA_OUT_OF_MEMORY, rank=1, step=7, peak_bytes=123, requested_bytes=None
    )
    assert json.loads(message.to_json()) == {
        "reason": "CUDAOutOfMemory",
        "rank": 1,
        "step": 7,
        "peakBytes": 123,
    }


def test_message_never_exceeds_the_kubelet_limit() -> None:
    message = TerminationMessage(reason=Reason.TRAINING_ERROR, rank=0, message="x" * 10_000)
    text = message.to_json()
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    assert json.loads(text)["reason"] == "TrainingError"


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [
        pytest.param(
            Reason.CUDA_OUT_OF_MEMORY, Reason.TRAINING_ERROR, "CUDAOutOfMemory", id="oom survives peer errors"
        ),
        pytest.param(
            Reason.TRAINING_ERROR, Reason.CUDA_OUT_OF_MEMORY, "CUDAOutOfMemory", id="oom replaces an error"
        ),
        pytest.param(Reason.COMPLETED, Reason.COMPLETED, "Completed", id="completed twice"),
        pytest.param(Reason.INVALID_PLAN, Reason.TRAINING_ERROR, "InvalidPlan", id="invalid plan kept"),
    ],
)
def test_most_informative_reason_wins(tmp_path: Path, first: Reason, second: Reason, kept: str) -> None:
    path = tmp_path / "termination-log"
    write_termination_message(TerminationMessage(reason=first, rank=0), path)
    write_termination_message(TerminationMessage(reason=second, rank=1), path)
    assert (read_termination_message(path) or {})["reason"] == kept


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total)", 2 << 30),
        ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1048576 bytes.", 1 << 20),
        ("CUDA out of memory (simulated)", None),
    ],
)
def test_requested_bytes_parsed_from_oom_text(text: str, expected: int | None) -> None:
    assert requested_bytes_from_error(RuntimeError(text)) == expected


def test_host_out_of_memory_detection() -> None:
    assert is_host_out_of_memory(MemoryError())
    assert is_host_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not is_host_out_of_memory(RuntimeError("shape mismatch"))

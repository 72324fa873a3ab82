"""The termination contract between trainer and operator: reasons, exit codes, the message schema.

Kubernetes copies the file at `terminationMessagePath` (default /dev/termination-log, at most
4096 bytes) into `status.containerStatuses[].state.terminated.message`. The trainer writes one compact
JSON object there (`TerminationMessage`) and exits with the reason's code; the training Job's
podFailurePolicy fails the Job at once on `FAIL_JOB_EXIT_CODES` (memfit re-plans instead of retrying),
and the operator re-plans on `CUDAOutOfMemory`/`HostOutOfMemory`, gives up on `InvalidPlan` and
records `Completed` peaks. This module is the one place all three read it from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum

# The kubelet truncates longer messages (k8s.io/api core/v1 Container.terminationMessagePath).
MAX_MESSAGE_BYTES = 4096
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


class TerminationReason(StrEnum):
    """Why the trainer stopped (CamelCase, like Kubernetes reasons)."""

    COMPLETED = "Completed"
    CUDA_OUT_OF_MEMORY = "CUDAOutOfMemory"
    HOST_OUT_OF_MEMORY = "HostOutOfMemory"
    INVALID_PLAN = "InvalidPlan"
    TRAINING_ERROR = "TrainingError"
    # The first steps' measured peak exceeded the plan's prediction plus headroom: the trainer saved a
    # checkpoint and stopped before an OOM, so that the operator re-plans (docs/operator.md).
    MEMORY_OVER_PLAN = "MemoryOverPlan"


EXIT_COMPLETED = 0
EXIT_TRAINING_ERROR = 1
EXIT_OUT_OF_MEMORY = 87
EXIT_INVALID_PLAN = 88
EXIT_MEMORY_OVER_PLAN = 89
# Exit codes that are decisions for memfit (re-plan or give up), never pod retries.
FAIL_JOB_EXIT_CODES = (EXIT_OUT_OF_MEMORY, EXIT_INVALID_PLAN, EXIT_MEMORY_OVER_PLAN)
# The container's own reason when the kernel killed it for host RAM.
CONTAINER_OOM_KILLED = "OOMKilled"

EXIT_CODES: dict[TerminationReason, int] = {
    TerminationReason.COMPLETED: EXIT_COMPLETED,
    TerminationReason.CUDA_OUT_OF_MEMORY: EXIT_OUT_OF_MEMORY,
    TerminationReason.HOST_OUT_OF_MEMORY: EXIT_OUT_OF_MEMORY,
    TerminationReason.INVALID_PLAN: EXIT_INVALID_PLAN,
    TerminationReason.TRAINING_ERROR: EXIT_TRAINING_ERROR,
    TerminationReason.MEMORY_OVER_PLAN: EXIT_MEMORY_OVER_PLAN,
}

# Wire keys of the message the operator reads.
KEY_REASON = "reason"
KEY_PEAK_BYTES = "peakBytes"
KEY_STEP = "step"
KEY_MEMORY_METER = "memoryMeter"
KEY_MESSAGE = "message"
KEY_BUDGET_BYTES = "budgetBytes"  # MemoryOverPlan: the prediction plus headroom the peak exceeded
KEY_RANK_PEAKS = "rankPeaks"  # allocator peak of every rank, rank order (the meter's kind of bytes)
KEY_RESERVED_PEAK_BYTES = "reservedPeakBytes"  # CUDA caching allocator reservation, max over ranks
KEY_DEVICE_PEAK_BYTES = "devicePeakBytes"  # NVML process bytes (or a simulated GPU's), max over ranks
KEY_DEVICE = "device"  # where the peaks were measured: DEVICE_CPU, DEVICE_CUDA or DEVICE_SIMULATED_CUDA
DEVICE_CPU = "cpu"
DEVICE_CUDA = "cuda"
DEVICE_SIMULATED_CUDA = "simulated-cuda"  # the CPU under a simulated GPU memory budget (the test bed)
KEY_STEP_SECONDS = "stepSeconds"  # mean seconds per optimizer step (after the first), slowest rank
KEY_TOKENS_PER_SECOND = "tokensPerSecond"  # the whole job's tokens per second at that step time
KEY_EVAL_LOSS = "evalLoss"  # Completed: loss on spec.data's eval set after the last step (jobs with one)
MAX_RANK_PEAKS = 64  # keeps the message well under MAX_MESSAGE_BYTES


@dataclass(frozen=True, slots=True)
class TerminationMessage:
    """The JSON object in the termination message; None fields are left out of the wire form."""

    reason: TerminationReason
    rank: int | None = None
    step: int | None = None
    steps: int | None = None
    peak_bytes: int | None = None
    requested_bytes: int | None = None
    capacity_bytes: int | None = None
    final_loss: float | None = None
    eval_loss: float | None = None
    resumed_from_step: int | None = None
    memory_meter: str | None = None
    rank_peaks: list[int] | None = None
    reserved_peak_bytes: int | None = None
    device_peak_bytes: int | None = None
    device: str | None = None
    step_seconds: float | None = None
    tokens_per_second: float | None = None
    message: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        """camelCase keys, no None values."""
        wire: dict[str, object] = {}
        for key, value in asdict(self).items():
            if key == "extra" or value is None:
                continue
            wire[_camel(key)] = value.value if isinstance(value, TerminationReason) else value
        wire.update(self.extra)
        return wire

    def to_json(self) -> str:
        """Compact JSON of at most MAX_MESSAGE_BYTES (the free-text `message` is shortened to fit)."""
        wire = self.to_wire()
        text = json.dumps(wire, separators=(",", ":"))
        while len(text.encode()) > MAX_MESSAGE_BYTES and isinstance(wire.get(KEY_MESSAGE), str):
            message = str(wire[KEY_MESSAGE])
            wire[KEY_MESSAGE] = (
                message[: max(0, len(message) - (len(text.encode()) - MAX_MESSAGE_BYTES) - 8)] + "…"
            )
            text = json.dumps(wire, separators=(",", ":"))
            if not message:
                break
        return text


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def exit_code(reason: TerminationReason) -> int:
    """The process exit code for a reason."""
    return EXIT_CODES[reason]


def reason_from_json(text: str) -> TerminationReason | None:
    """The reason of a termination message, or None if the text is not one."""
    try:
        value = json.loads(text).get(KEY_REASON)
        return TerminationReason(value)
    except (ValueError, AttributeError, TypeError):
        return None


def parse_message(text: str) -> dict[str, object]:
    """The termination message as a JSON object ({} when empty or not one: a crash's free text)."""
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


# What PyTorch prints when the CUDA caching allocator cannot allocate (torch.OutOfMemoryError, "CUDA out of
# memory. Tried to allocate ..."): a user's own script that dies of it leaves these words in the last log
# lines, which FallbackToLogsOnError makes its termination message.
CUDA_OOM_WORDS = ("torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "CUDA out of memory")


def out_of_memory_reason(
    message: dict[str, object], *, exit_code: int | None, container_reason: str, text: str = ""
) -> TerminationReason | None:
    """CUDAOutOfMemory or HostOutOfMemory when a pod ran out of memory, else None.

    The message's own reason wins (both OOM reasons exit with EXIT_OUT_OF_MEMORY); without one, the
    kernel's OOMKilled means host RAM, the exit code alone means the trainer's CUDA OOM, and PyTorch's own
    words in a free-text message (`text`: a user's script's last log lines) mean a CUDA OOM too."""
    reason = message.get(KEY_REASON)
    if reason == TerminationReason.CUDA_OUT_OF_MEMORY:
        return TerminationReason.CUDA_OUT_OF_MEMORY
    if reason == TerminationReason.HOST_OUT_OF_MEMORY or container_reason == CONTAINER_OOM_KILLED:
        return TerminationReason.HOST_OUT_OF_MEMORY
    if exit_code == EXIT_OUT_OF_MEMORY:
        return TerminationReason.CUDA_OUT_OF_MEMORY
    if not message and exit_code and any(words in text for words in CUDA_OOM_WORDS):
        return TerminationReason.CUDA_OUT_OF_MEMORY
    return None

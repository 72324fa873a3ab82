"""Exit codes and the termination-message schema the operator reads (one place; see docs/trainer.md).

Kubernetes copies the file at `terminationMessagePath` (default /dev/termination-log, at most
4096 bytes) into `status.containerStatuses[].state.terminated.message`. The trainer writes one compact
JSON object there; the operator re-plans on `CUDAOutOfMemory`/`HostOutOfMemory`, gives up on
`InvalidPlan` and records `Completed` peaks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

ENV_TERMINATION_MESSAGE_PATH = "MEMFIT_TERMINATION_MESSAGE_PATH"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# The kubelet truncates longer messages (k8s.io/api core/v1 Container.terminationMessagePath).
MAX_MESSAGE_BYTES = 4096


class Reason(StrEnum):
    """Why the trainer stopped (CamelCase, like Kubernetes reasons)."""

    COMPLETED = "Completed"
    CUDA_OUT_OF_MEMORY = "CUDAOutOfMemory"
    HOST_OUT_OF_MEMORY = "HostOutOfMemory"
    INVALID_PLAN = "InvalidPlan"
    TRAINING_ERROR = "TrainingError"


EXIT_COMPLETED = 0
EXIT_TRAINING_ERROR = 1
EXIT_OUT_OF_MEMORY = 87
EXIT_INVALID_PLAN = 88

EXIT_CODES: dict[Reason, int] = {
    Reason.COMPLETED: EXIT_COMPLETED,
    Reason.CUDA_OUT_OF_MEMORY: EXIT_OUT_OF_MEMORY,
    Reason.HOST_OUT_OF_MEMORY: EXIT_OUT_OF_MEMORY,
    Reason.INVALID_PLAN: EXIT_INVALID_PLAN,
    Reason.TRAINING_ERROR: EXIT_TRAINING_ERROR,
}

# When several local ranks write the same file, the most informative reason wins: an OOM on one rank
# makes its peers fail with collective errors, which must not hide the OOM.
_PRIORITY: dict[Reason, int] = {
    Reason.COMPLETED: 0,
    Reason.TRAINING_ERROR: 1,
    Reason.INVALID_PLAN: 2,
    Reason.HOST_OUT_OF_MEMORY: 3,
    Reason.CUDA_OUT_OF_MEMORY: 4,
}

_REQUESTED = re.compile(r"(?:Tried to allocate|you tried to allocate)\s+([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)")
_UNIT_BYTES = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


@dataclass(frozen=True, slots=True)
class TerminationMessage:
    """The JSON object in the termination message; None fields are left out of the wire form."""

    reason: Reason
    rank: int | None = None
    step: int | None = None
    steps: int | None = None
    peak_bytes: int | None = None
    requested_bytes: int | None = None
    capacity_bytes: int | None = None
    final_loss: float | None = None
    resumed_from_step: int | None = None
    memory_meter: str | None = None
    message: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        """camelCase keys, no None values."""
        wire: dict[str, object] = {}
        for key, value in asdict(self).items():
            if key == "extra" or value is None:
                continue
            wire[_camel(key)] = value.value if isinstance(value, Reason) else value
        wire.update(self.extra)
        return wire

    def to_json(self) -> str:
        """Compact JSON of at most MAX_MESSAGE_BYTES (the free-text `message` is shortened to fit)."""
        wire = self.to_wire()
        text = json.dumps(wire, separators=(",", ":"))
        while len(text.encode()) > MAX_MESSAGE_BYTES and isinstance(wire.get("message"), str):
            message = str(wire["message"])
            wire["message"] = (
                message[: max(0, len(message) - (len(text.encode()) - MAX_MESSAGE_BYTES) - 8)] + "…"
            )
            text = json.dumps(wire, separators=(",", ":"))
            if not message:
                break
        return text


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def exit_code(reason: Reason) -> int:
    """The process exit code for a reason."""
    return EXIT_CODES[reason]


def reason_from_json(text: str) -> Reason | None:
    """The reason of a termination message, or None if the text is not one."""
    try:
        value = json.loads(text).get("reason")
        return Reason(value)
    except (ValueError, AttributeError, TypeError):
        return None


def requested_bytes_from_error(error: BaseException) -> int | None:
    """The allocation size in an out-of-memory message ("Tried to allocate 2.00 GiB"), if any."""
    found = _REQUESTED.search(str(error))
    if not found:
        return None
    return int(float(found.group(1)) * _UNIT_BYTES[found.group(2)])


def is_host_out_of_memory(error: BaseException) -> bool:
    """Host RAM exhausted: Python's MemoryError or torch's CPU allocator failure."""
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(error)
    )


def termination_path(environ: dict[str, str] | os._Environ[str]) -> Path:
    """Where to write: $MEMFIT_TERMINATION_MESSAGE_PATH or /dev/termination-log."""
    return Path(environ.get(ENV_TERMINATION_MESSAGE_PATH) or DEFAULT_TERMINATION_MESSAGE_PATH)


def write_termination_message(message: TerminationMessage, path: Path) -> bool:
    """Write the message unless a more important one is already there; True if written.

    Safe for several local ranks writing the same file (an exclusive lock around read-compare-write).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.seek(0)
                existing = reason_from_json(handle.read())
                if existing is not None and _PRIORITY[existing] > _PRIORITY[message.reason]:
                    return False
                handle.seek(0)
                handle.truncate()
                handle.write(message.to_json())
                handle.flush()
                return True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError:
        return False


def read_termination_message(path: Path) -> dict[str, object] | None:
    """The message written at path, or None when absent or not JSON."""
    with contextlib.suppress(OSError, ValueError):
        value = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(value, dict):
            return value
    return None

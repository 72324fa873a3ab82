"""The trainer's side of the termination contract: writing the message safely from several ranks.

The contract itself (reasons, exit codes, the message schema) lives in `memfit.api.termination`, read
by the operator's Job builder and its pod observer too; see docs/trainer.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path

from memfit.api import pod as contract
from memfit.api.termination import (
    DEFAULT_TERMINATION_MESSAGE_PATH,
    EXIT_CODES,
    EXIT_COMPLETED,
    EXIT_INVALID_PLAN,
    EXIT_OUT_OF_MEMORY,
    EXIT_TRAINING_ERROR,
    MAX_MESSAGE_BYTES,
    TerminationMessage,
    exit_code,
    reason_from_json,
)
from memfit.api.termination import TerminationReason as Reason

__all__ = [
    "DEFAULT_TERMINATION_MESSAGE_PATH",
    "ENV_TERMINATION_MESSAGE_PATH",
    "EXIT_CODES",
    "EXIT_COMPLETED",
    "EXIT_INVALID_PLAN",
    "EXIT_OUT_OF_MEMORY",
    "EXIT_TRAINING_ERROR",
    "MAX_MESSAGE_BYTES",
    "Reason",
    "TerminationMessage",
    "exit_code",
    "is_host_out_of_memory",
    "read_termination_message",
    "reason_from_json",
    "requested_bytes_from_error",
    "termination_path",
    "write_termination_message",
]

ENV_TERMINATION_MESSAGE_PATH = contract.ENV_TERMINATION_MESSAGE_PATH

# When several local ranks write the same file, the most informative reason wins: an OOM on one rank
# makes its peers fail with collective errors, which must not hide the OOM.
_PRIORITY: dict[Reason, int] = {
    Reason.COMPLETED: 0,
    Reason.TRAINING_ERROR: 1,
    Reason.INVALID_PLAN: 2,
    Reason.MEMORY_OVER_PLAN: 2,
    Reason.HOST_OUT_OF_MEMORY: 3,
    Reason.CUDA_OUT_OF_MEMORY: 4,
}

_REQUESTED = re.compile(r"(?:Tried to allocate|you tried to allocate)\s+([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)")
_UNIT_BYTES = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


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

"""What a probed run's outcome says: measured, out of memory, or a finding that names what was seen."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from enum import StrEnum

from memfit.api.termination import out_of_memory_reason

from memfit_trainer.probe.records import ProbeResult

STDERR_TAIL_LINES = 8


class Outcome(StrEnum):
    MEASURED = "measured"
    OUT_OF_MEMORY = "out-of-memory"
    IGNORES_MICRO_BATCH = "ignores-micro-batch"
    NEVER_STEPPED = "never-stepped"
    EXITED_EARLY = "exited-early"
    HUNG = "hung"


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the driver saw of one run of the script."""

    micro_batch: int  # planned
    steps_wanted: int
    exit_code: int | None  # None: killed at the timeout
    timeout_seconds: float
    stderr_tail: str
    result: ProbeResult | None  # rank 0's, when it wrote one


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    finding: str  # empty when measured


def steps_seen(facts: RunFacts) -> int:
    """Optimizer steps the run's rank 0 ended (read or not)."""
    result = facts.result
    return max(len(result.steps), result.steps_ended) if result is not None else 0


def fed_micro_batches(result: ProbeResult) -> list[int]:
    return [s.micro_batch for s in result.steps if s.micro_batch is not None]


def judge(facts: RunFacts) -> Verdict:
    """The run's outcome; a finding says what was seen, in words a user acts on."""
    planned, seen = facts.micro_batch, steps_seen(facts)
    if facts.exit_code is None:
        return Verdict(Outcome.HUNG, f"the script hung: killed after {facts.timeout_seconds:g}s at micro-batch "
                       f"{planned} with {seen} of {facts.steps_wanted} optimizer steps seen")  # fmt: skip
    oom = out_of_memory_reason({}, exit_code=facts.exit_code, container_reason="", text=facts.stderr_tail)
    if oom is not None:
        return Verdict(Outcome.OUT_OF_MEMORY, f"micro-batch {planned} ran out of memory ({oom.value}) after "
                       f"{seen} optimizer steps")  # fmt: skip
    result = facts.result
    if result is not None:
        other = [fed for fed in fed_micro_batches(result) if fed != planned]
        if other:
            return Verdict(Outcome.IGNORES_MICRO_BATCH, f"the script ran micro-batch {other[0]} where memfit "
                           f"planned {planned}: it does not honor microBatchSize")  # fmt: skip
    if seen >= facts.steps_wanted:
        return Verdict(Outcome.MEASURED, "")
    if seen == 0 and facts.exit_code == 0:
        calls = result.forward_calls if result is not None else 0
        return Verdict(Outcome.NEVER_STEPPED, f"the script never called an optimizer step: it exited with code 0 "
                       f"after {calls} model calls and no torch.optim or DeepSpeed step")  # fmt: skip
    tail = facts.stderr_tail.strip() or "(nothing on stderr)"
    killed = (
        " (SIGKILL: the kernel's OOM killer, if host memory ran out)"
        if facts.exit_code == -signal.SIGKILL
        else ""
    )
    return Verdict(
        Outcome.EXITED_EARLY,
        f"the script exited early with code {facts.exit_code}{killed} after {seen} of {facts.steps_wanted} "
        f"optimizer steps at micro-batch {planned}; last lines of its stderr:\n{tail}",
    )


# The last line of a Python traceback (`ValueError: ...`), also as torchrun prefixes a worker's (`[rank0]: ...`).
_ERROR_LINE = re.compile(r"^(\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*\S")


def last_lines(text: str, count: int = STDERR_TAIL_LINES) -> str:
    """The last `count` lines; when the error that ended the script is above them (torchrun prints its
    own summary after the worker's traceback), that line first."""
    lines = text.rstrip().splitlines()
    tail = lines[-count:]
    error = next((line for line in reversed(lines[:-count])
                  if _ERROR_LINE.match(line) and "ChildFailedError" not in line), None)  # not torchrun's own
    if error is not None and not any(_ERROR_LINE.match(line) for line in tail):
        tail = [error, "...", *tail]
    return "\n".join(tail)

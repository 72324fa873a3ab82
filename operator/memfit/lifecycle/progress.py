"""status.progress from rank 0's metrics: step / maxSteps, losses, job throughput and ETA (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from memfit.api import pod as contract
from memfit.api.job import Progress
from memfit.api.reasons import Reason
from memfit.api.termination import KEY_EVAL_LOSS
from memfit.lifecycle.snapshot import TrainerSample

# The trainer's series (memfit.api.pod, served by memfit_trainer.metrics) the operator reads; a sample
# without a step is no sample.
STEP = contract.METRIC_STEP
LOSS = contract.METRIC_LOSS
EVAL_LOSS = contract.METRIC_EVAL_LOSS
TOKENS_PER_SECOND = contract.METRIC_TOKENS_PER_SECOND
STEP_SECONDS_SUM = contract.METRIC_STEP_SECONDS_SUM
STEP_SECONDS_COUNT = contract.METRIC_STEP_SECONDS_COUNT
RESUMED_FROM_STEP = contract.METRIC_RESUMED_FROM_STEP
POD_REPLACED = Reason.POD_REPLACED  # Event reasons
RESUMED = Reason.RESUMED
SERIES = contract.PROGRESS_SERIES


def trainer_sample(values: Mapping[str, float], *, attempt: int, pod: str = "") -> TrainerSample | None:
    """The sample from rank 0's series (name -> value); None without a step (not a memfit trainer)."""
    step = _finite(values.get(STEP))
    if step is None or step < 0:
        return None
    resumed = _finite(values.get(RESUMED_FROM_STEP))
    resumed_from = int(resumed) if resumed is not None and resumed >= 0 else None
    timed = int(_finite(values.get(STEP_SECONDS_COUNT)) or 0)  # steps this pod ran
    return TrainerSample(
        attempt=attempt,
        # A resumed pod is at its checkpoint's step before it runs one (older trainers report 0 then).
        step=max(int(step), resumed_from or 0),
        # The loss and rate gauges read 0 until the pod's first step.
        loss=_finite(values.get(LOSS)) if timed > 0 else None,
        eval_loss=_finite(values.get(EVAL_LOSS)),
        tokens_per_second=_finite(values.get(TOKENS_PER_SECOND)) if timed > 0 else None,
        step_seconds_sum=_finite(values.get(STEP_SECONDS_SUM)) or 0.0,
        step_count=timed,
        resumed_from_step=resumed_from,
        pod=pod,
    )


def progress_of(sample: TrainerSample, *, max_steps: int, data_parallel: int, now: datetime) -> Progress:
    """status.progress: rank 0's rate x the data-parallel ranks (every rank trains the same number of
    tokens per step), ETA = the steps left x this pod's mean step time."""
    step = min(sample.step, max_steps)
    step_seconds = sample.step_seconds_sum / sample.step_count if sample.step_count else None
    eta_seconds = round((max_steps - step) * step_seconds) if step_seconds is not None else None
    if step >= max_steps:
        eta_seconds = 0
    tokens = sample.tokens_per_second * data_parallel if sample.tokens_per_second is not None else None
    return Progress(
        step=step,
        max_steps=max_steps,
        steps=f"{step}/{max_steps}",
        loss=_round(sample.loss),
        eval_loss=_round(sample.eval_loss),
        tokens_per_second=round(tokens, 1) if tokens is not None else None,
        step_seconds=round(step_seconds, 4) if step_seconds is not None else None,
        eta_seconds=eta_seconds,
        eta=format_eta(eta_seconds) if eta_seconds is not None else None,
        resumed_from_step=sample.resumed_from_step,
        attempt=sample.attempt,
        pod=sample.pod or None,
        updated_at=now,
    )


def still_starting(sample: TrainerSample, previous: Progress | None) -> bool:
    """A new pod (a replacement, or a re-planned attempt's) that has neither loaded a checkpoint nor run a
    step: its step reads 0, which is not where the job stands; the last progress stays until it has one."""
    return (
        previous is not None
        and sample.step_count == 0
        and sample.resumed_from_step is None
        and sample.step < previous.step
    )


def pod_changes(sample: TrainerSample, previous: Progress | None) -> list[tuple[str, str, bool]]:
    """(reason, message, warning) of the Events a new rank-0 pod deserves: `PodReplaced` when the same
    attempt's pod changed, `Resumed` when a new pod (replacement or a new attempt's) loaded a checkpoint."""
    same_attempt = previous is not None and previous.attempt == sample.attempt
    new_pod = not same_attempt or (previous is not None and previous.pod is not None and previous.pod != sample.pod)
    out: list[tuple[str, str, bool]] = []
    resumed = sample.resumed_from_step
    if same_attempt and new_pod and previous is not None:
        then = (f"resumes from the checkpoint at step {resumed}" if resumed is not None
                else "no checkpoint to resume from: it starts again at step 0")
        out.append((POD_REPLACED, f"attempt {sample.attempt}: rank-0 pod {previous.pod} (at step {previous.step}) "
                                  f"was replaced by {sample.pod}, which {then}", True))
    if new_pod and resumed is not None:
        out.append((RESUMED, f"attempt {sample.attempt}: pod {sample.pod} resumed from the checkpoint at step "
                             f"{resumed}", False))
    return out


def final_progress(
    previous: Progress | None, done: Mapping[str, object], *, max_steps: int, attempt: int, now: datetime
) -> Progress:
    """status.progress of a finished job from rank 0's Completed message, also when the job ended before
    any read (a short run between two reads): every step done, the final loss, and the run's mean step
    time and whole-job rate where the trainer reported them (older trainers: what the last read saw)."""
    final, resumed, evaluated = done.get("finalLoss"), done.get("resumedFromStep"), done.get(KEY_EVAL_LOSS)
    step_seconds, tokens = done.get("stepSeconds"), done.get("tokensPerSecond")
    if previous is not None and previous.attempt != attempt:
        previous = None  # an earlier attempt's numbers say nothing about this one
    base = previous or Progress(step=0, max_steps=max_steps, steps="", attempt=attempt, updated_at=now)
    if done:  # the message says whether the finishing pod resumed; a read of an earlier pod does not
        base = base.model_copy(update={"resumed_from_step": None})
    return base.model_copy(update={
        "step": max_steps, "steps": f"{max_steps}/{base.max_steps}", "eta_seconds": 0, "eta": "0s",
        "loss": _round(_number(final)) if _number(final) is not None else base.loss,
        "eval_loss": _round(_number(evaluated)) if _number(evaluated) is not None else base.eval_loss,
        "step_seconds": _round(_number(step_seconds), 4) if _number(step_seconds) is not None else base.step_seconds,
        "tokens_per_second": _round(_number(tokens), 1) if _number(tokens) is not None else base.tokens_per_second,
        "resumed_from_step": resumed if isinstance(resumed, int) else base.resumed_from_step,
        "attempt": attempt, "updated_at": now,
    })  # fmt: skip


def _number(value: object) -> float | None:
    """A finite, non-negative number from a termination message (JSON), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def format_eta(seconds: int) -> str:
    """Seconds for people, in the two largest units: 45s, 4m05s, 1h05m, 3d04h."""
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _round(value: float | None, digits: int = 6) -> float | None:
    return round(value, digits) if value is not None else None

"""The probe's API for a script's loss: what `status.progress` shows of a script memfit's probe monitors.

    try:
        from memfit_trainer.probe.report import report_loss
    except ImportError:  # not under memfit's probe
        def report_loss(value: float) -> None: ...

    report_loss(loss.item())  # at the script's own logging interval

Under the probe's monitor (a training pod of a `spec.container` job) the package is on the script's path;
anywhere else the import fails and the script runs as before. The Hugging Face Trainer needs none of this:
the probe reads the loss the Trainer logs (memfit_trainer.probe.hooks).
"""

from __future__ import annotations

from collections.abc import Callable

# Set by the probe's hooks when they are installed in this process: (series, value) -> None.
_sink: Callable[[str, float], None] | None = None
LOSS = "loss"
EVAL_LOSS = "eval_loss"


def report_loss(value: float) -> None:
    """The training loss of the latest step (nothing when the probe is not installed)."""
    if _sink is not None:
        _sink(LOSS, float(value))


def report_eval_loss(value: float) -> None:
    """The loss of the latest evaluation (nothing when the probe is not installed)."""
    if _sink is not None:
        _sink(EVAL_LOSS, float(value))


def install(sink: Callable[[str, float], None]) -> None:
    global _sink
    _sink = sink

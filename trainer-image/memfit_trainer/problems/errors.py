"""Errors raised while building a problem (the trainer reports InvalidPlan, the profiler a Profile error)."""

from __future__ import annotations


class ProblemError(ValueError):
    """The problem cannot be built; the message names the field and says how to fix it."""


class DepthNotSupported(ProblemError):
    """The problem cannot be built with fewer blocks (no `depth` argument, no layer count in its config)."""

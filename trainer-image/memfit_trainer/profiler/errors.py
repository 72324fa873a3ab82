"""Profiler errors and exit codes: bad input names its field; every failure still yields a Profile."""

from __future__ import annotations

# Exit codes of `memfit-trainer profile` (docs/profiler.md). Distinct from the trainer's so that the
# operator can tell "fix the spec" (no retry) from "the run failed" (retry with backoff).
EXIT_OK = 0
EXIT_INVALID_PROBLEM = 2  # the problem or an option is invalid: fix the spec, retrying cannot help
EXIT_PROFILE_FAILED = 3  # the problem is valid but no configuration could be measured


class ProfileInputError(ValueError):
    """Invalid input; `field` is the wire path of the offending value (e.g. `problem.builtin.heads`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


class ProfileRunError(RuntimeError):
    """The problem is valid but profiling failed (every configuration failed, or the step crashed)."""


class DepthUnavailable(ProfileInputError):
    """A depth-reduced profile is not possible for this model (no repeated blocks, an entrypoint
    without a `depth` argument or one that ignores it): the profile says so and carries only the
    full model's shape, and the operator plans analytically (condition AnalyticOnly)."""

    def __init__(self, message: str, *, shape: object | None = None) -> None:
        super().__init__("depth", message)
        self.shape = shape

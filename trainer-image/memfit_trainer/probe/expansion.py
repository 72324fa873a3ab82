"""Kubernetes' `$(VAR)` expansion of a command, done by the probe once per run.

In a pod, the kubelet expands `$(MEMFIT_MICRO_BATCH_SIZE)` in `command` and `args` once, from the container's
variables, before the process starts. The probe runs the script at several micro-batches inside one
container, so memfit's profiling pod passes the user's command with `$(` escaped as `$$(` (the kubelet turns
that back into `$(`), and the probe expands it here with each run's own variables, by the same rules: a
defined name is replaced, `$$` is one `$`, an unknown name stays as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(sub, text)


def expand_command(command: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(expand(part, env) for part in command)


def escape(text: str) -> str:
    """`text` as a pod's command or argument that reaches the process unexpanded: every `$` doubled."""
    return text.replace("$", "$$")

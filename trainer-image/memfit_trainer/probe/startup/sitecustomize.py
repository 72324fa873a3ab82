"""memfit's probe hook-in: Python imports this at start-up when its folder is on PYTHONPATH.

Does nothing unless MEMFIT_PROBE_OUT is set; then installs memfit_trainer.probe.hooks into this process.
A failure (no torch, no memfit_trainer) leaves the process as it was, with one line on stderr. Either
way, the sitecustomize this file shadows (a distribution's or the image's own) still runs.
"""

import os
import sys

# memfit_trainer.probe.env.ENV_PROBE_OUT, spelled here so that an inactive probe imports nothing.
_ENV_PROBE_OUT = "MEMFIT_PROBE_OUT"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _activate() -> None:
    try:
        from memfit_trainer.probe import hooks
    except ImportError:
        # This folder sits inside the memfit_trainer package: its root goes at the end of sys.path, so it
        # shadows nothing of the script's own.
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))
        from memfit_trainer.probe import hooks
    hooks.install_from_env(os.environ)


def _run_shadowed() -> None:
    import importlib.util

    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == _HERE:
            continue
        candidate = os.path.join(entry or os.curdir, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_memfit_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get(_ENV_PROBE_OUT):
    try:
        _activate()
    except Exception as error:  # never break the user's process: it then runs unprobed
        print(f"memfit probe: inactive ({type(error).__name__}: {error})", file=sys.stderr)
try:
    _run_shadowed()
except Exception as error:
    print(
        f"memfit probe: the shadowed sitecustomize failed ({type(error).__name__}: {error})", file=sys.stderr
    )

"""The probe as a folder of plain Python files, for a user's image that has torch but nothing of memfit.

memfit's profiling pod copies it (`memfit-trainer probe-bundle --to DIR`, an init container of memfit's
trainer image) into a volume the user's container mounts, and runs `python3 DIR/memfit_probe.py ARGS` there
(the image's PYTHONPATH stays as it is: the folder is the launcher's own sys.path[0]; in the script's
processes the probe's sitecustomize finds it). The probe imports only the standard library, torch, its own meters and
two modules of memfit's API without pydantic (the pod contract and the termination words), so the bundle is
those files and a package marker for `memfit.api` that imports nothing.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import memfit

import memfit_trainer

API_MODULES = ("pod.py", "termination.py")
TRAINER_PACKAGES = ("probe", "meters")
LAUNCHER = "memfit_probe.py"  # memfit.api.pod.PROBE_LAUNCHER
STARTED_AT = "started-at"  # memfit.api.pod.PROBE_STARTED_AT
LAUNCHER_TEXT = (
    '"""`python3 memfit_probe.py ARGS`: the probe\'s driver from this folder (memfit_trainer.probe.command)."""\n'
    "import sys\n\n"
    "from memfit_trainer.probe.command import main  # this folder is sys.path[0] when run as a script\n\n"
    "sys.exit(main())\n"
)
BUNDLE_API_INIT = '"""memfit API: the pod contract and termination words only (the probe\'s bundle)."""\n'


def _python_files(source: Path, target: Path) -> None:
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def write_bundle(dest: Path) -> list[Path]:
    """Copy the probe's files under `dest` (a PYTHONPATH entry); the files written."""
    trainer_root, api_root = Path(memfit_trainer.__file__).parent, Path(memfit.__file__).parent
    (dest / "memfit_trainer").mkdir(parents=True, exist_ok=True)
    shutil.copy2(trainer_root / "__init__.py", dest / "memfit_trainer" / "__init__.py")
    for package in TRAINER_PACKAGES:
        _python_files(trainer_root / package, dest / "memfit_trainer" / package)
    (dest / "memfit" / "api").mkdir(parents=True, exist_ok=True)
    shutil.copy2(api_root / "__init__.py", dest / "memfit" / "__init__.py")
    (dest / "memfit" / "api" / "__init__.py").write_text(BUNDLE_API_INIT, encoding="utf-8")
    for module in API_MODULES:
        shutil.copy2(api_root / "api" / module, dest / "memfit" / "api" / module)
    (dest / LAUNCHER).write_text(LAUNCHER_TEXT, encoding="utf-8")
    # When the profiling pod's first container ran: the probe's budget counts from here (`--started-at`), so
    # its last run ends before the Job's deadline whatever the profiler took.
    (dest / STARTED_AT).write_text(f"{time.time():.3f}\n", encoding="utf-8")
    return sorted(p for p in dest.rglob("*.py"))

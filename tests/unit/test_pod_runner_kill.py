"""The local pod runner ends a container as a kubelet ends its cgroup: every process under it, also those a
launcher started in sessions of their own (torchrun's workers), which a SIGKILL of the process group missed
(hack/memfit_testbed/pod_runner._kill)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
from memfit_testbed.pod_runner import _kill, descendants

# A launcher that starts a worker in a new session (as torchrun does), prints its pid, and waits on it.
LAUNCHER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(worker.pid, flush=True)
worker.wait()
"""


def test_a_worker_in_its_own_session_dies_with_its_container() -> None:
    container = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, start_new_session=True)
    assert container.stdout is not None
    worker = int(container.stdout.readline())
    assert worker in descendants(container.pid)
    _kill(container, grace=0.5)
    deadline = time.monotonic() + 10
    while alive(worker):
        assert time.monotonic() < deadline, "the worker outlived its container"
        time.sleep(0.05)
    assert container.poll() is not None


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (by init: its launcher is gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

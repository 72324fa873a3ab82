"""Chaos harness: a test cluster whose pods KWOK simulates, a killable `memfit operator`, seeded profiles.

Used by tests/reliability and by benchmarks/reliability.py and benchmarks/scale.py, so the tests are
fast variants of exactly what the benchmarks measure.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from memfit.api.hashing import problem_hash
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.profile import Profile
from memfit.controller.kubeapi import KubeApi
from memfit.memory.problems import shape_from_problem

from memfit_testbed import kwok_pools, testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import free_port, operator_command
from memfit_testbed.paths import REPO
from memfit_testbed.reliability.chaos_stages import write_chaos_stages

GROUP, VERSION, MOTJ = "memfit.dev", "v1alpha1", "memoryoptimizedtrainingjobs"
QUICKSTART: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def quickstart(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """The quickstart MOTJ under another name, with spec sections replaced."""
    doc = copy.deepcopy(QUICKSTART)
    doc["metadata"] = {"name": name}
    if annotations:
        doc["metadata"]["annotations"] = dict(annotations)
    doc["spec"].update(copy.deepcopy(spec))
    return doc


def profile_of(doc: dict[str, Any]) -> Profile:
    """The analytic profile of a MOTJ's problem, as a profiling run would have recorded it."""
    spec = MemoryOptimizedTrainingJobSpec.model_validate(doc["spec"])
    return Profile(problem_hash=problem_hash(spec.problem), shape=shape_from_problem(spec.problem))


def install_crds(kubeconfig: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    files = sorted((REPO / "crds").glob("*.yaml"))
    args = ["kubectl", "apply", "--server-side", "--force-conflicts", "-o", "name"]
    for f in files:
        args += ["-f", str(f)]
    names = subprocess.run(args, check=True, env=env, capture_output=True, text=True).stdout.split()
    subprocess.run(
        ["kubectl", "wait", "--for=condition=Established", "--timeout=60s", *names],
        check=True,
        env=env,
        capture_output=True,
    )


def apply_gpunodepools(kube: Kube, pools: list[dict[str, Any]]) -> None:
    """Create or replace GPUNodePools."""
    custom = client.CustomObjectsApi(kube.api_client)
    for doc in pools:
        name = doc["metadata"]["name"]
        try:
            current = custom.get_cluster_custom_object(GROUP, VERSION, "gpunodepools", name)
            doc = {
                **doc,
                "metadata": {**doc["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
            }
            custom.replace_cluster_custom_object(GROUP, VERSION, "gpunodepools", name, doc)
        except ApiException as error:
            if error.status != 404:
                raise
            custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", doc)


def default_gpunodepools() -> list[dict[str, Any]]:
    path = REPO / "hack" / "kwok" / "gpunodepools.yaml"
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class ChaosCluster:
    """A TestCluster with the chaos stages (no pod runner), CRDs, KWOK pools and their GPUNodePools."""

    workdir: Path
    cluster: testcluster.TestCluster = field(init=False)
    kube: Kube = field(init=False)

    def start(self, *, pools: bool = True) -> float:
        self.workdir.mkdir(parents=True, exist_ok=True)
        stages = write_chaos_stages(self.workdir / "chaos-stages.yaml", profile_of(QUICKSTART).to_json())
        self.cluster = testcluster.TestCluster(
            workdir=self.workdir, stages=stages, pod_runner=False, die_with_parent=True
        )
        seconds = self.cluster.start()
        api_client = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self.kube = Kube(api_client=api_client, logs=lambda: self.cluster.log_tail(30))
        install_crds(self.cluster.kubeconfig)
        if pools:
            kwok_pools.apply_pools(str(self.cluster.kubeconfig))
            apply_gpunodepools(self.kube, default_gpunodepools())
        return seconds

    def stop(self) -> None:
        self.cluster.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def api(self) -> KubeApi:
        return KubeApi.from_client(self.kube.api_client)

    def namespace(self, name: str) -> str:
        self.kube.core.create_namespace({"metadata": {"name": name}})
        self.kube.wait(
            f"default ServiceAccount in {name}",
            lambda: self.kube.raw(self.kube.core.read_namespaced_service_account, "default", name),
            timeout=60,
        )
        return name


@dataclass
class OperatorProcess:
    """`memfit operator` as a real process that can be SIGKILLed and restarted any number of times."""

    kubeconfig: Path
    log_path: Path
    namespaces: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()
    resync_seconds: float = 1.0
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    starts: int = 0
    kills: int = 0
    crashes: list[int] = field(default_factory=list)  # exit codes of exits we did not cause

    def start(self) -> None:
        self.port = free_port()
        namespaces = [f"--namespace={ns}" for ns in self.namespaces]
        args = operator_command(self.port, *namespaces, *self.extra_args, resync_seconds=self.resync_seconds)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts} at {time.time():.3f}\n".encode())
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_crash(self) -> None:
        """Record an exit the harness did not cause (an operator crash)."""
        if self.proc is not None and self.proc.poll() is not None:
            self.crashes.append(int(self.proc.returncode))
            self.proc = None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 90.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.healthy():
                return time.monotonic() - t0
            if not self.alive():
                raise RuntimeError(f"operator exited: {self.log_tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"operator not healthy after {timeout:.0f}s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs, as when a node dies or the OOM killer strikes."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.kills += 1
        self.proc.wait()
        self.proc = None

    def stop(self) -> int | None:
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.proc = None
        return code

    def peak_rss_bytes(self) -> int:
        """VmHWM of the running process."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def tracebacks(self) -> int:
        """Unhandled errors the operator logged (its reconcile logs and counts them instead of crashing)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text.count("Traceback (most recent call last)")


def new_namespace(cc: ChaosCluster, prefix: str) -> str:
    return cc.namespace(f"{prefix}-{uuid.uuid4().hex[:5]}")


def operator_for(
    cc: ChaosCluster, namespace: str, log: Path, resync: float = 1.0, extra: tuple[str, ...] = ()
) -> OperatorProcess:
    """A running operator process scoped to `namespace`."""
    op = OperatorProcess(cc.kubeconfig, log, namespaces=(namespace,), resync_seconds=resync, extra_args=extra)
    op.start()
    op.wait_healthy()
    return op


def stop_checked(op: OperatorProcess) -> None:
    """Stop the operator; it must still be running (no crash) and must have logged no traceback."""
    op.check_crash()
    crashes, tracebacks, alive = op.crashes, op.tracebacks(), op.alive()
    op.stop()
    assert not crashes, f"operator exited {crashes}:\n{op.log_tail()}"
    assert alive, f"operator not running:\n{op.log_tail()}"
    assert tracebacks == 0, f"operator logged {tracebacks} traceback(s):\n{op.log_tail(6000)}"

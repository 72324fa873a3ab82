"""Run `memfit operator` against the test cluster and drive MOTJs through it."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.paths import REPO

GROUP, VERSION = "memfit.dev", "v1alpha1"
MOTJ = "memoryoptimizedtrainingjobs"
RUN_LOCAL = "memfit.dev/run-local=true"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def operator_command(port: int, *extra: str, resync_seconds: float = 1,
                     trainer_image: str = "memfit-trainer:test") -> list[str]:
    """The `memfit operator` command line the tests run (metrics on 127.0.0.1:`port`)."""
    return [
        sys.executable, "-m", "memfit.cli", "operator", "--metrics-host", "127.0.0.1",
        "--metrics-port", str(port), "--resync-seconds", str(resync_seconds),
        "--trainer-image", trainer_image,
        # The test bed's StorageClass (memfit_testbed.provisioner) is one folder every pod mounts.
        "--checkpoint-access-mode", "ReadWriteMany", *extra,
    ]  # fmt: skip


def start_operator(kubeconfig: Path, log_path: Path, *extra: str, pod_runner: bool = True,
                   trainer_image: str = "memfit-trainer:test",
                   env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start `memfit operator` as a host process, appending to `log_path`; its metrics port.

    With `pod_runner` its pods carry the label the local pod runner runs; without it they go to a real
    kubelet (the real node) and run `trainer_image`."""
    port = free_port()
    env = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
    label = ("--extra-pod-label", RUN_LOCAL) if pod_runner else ()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            operator_command(port, *label, *extra, trainer_image=trainer_image),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, port


def stop_operator(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def operator_process(
    kubeconfig: Path, log_path: Path, *extra: str, pod_runner: bool = True,
    trainer_image: str = "memfit-trainer:test", env: dict[str, str] | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`memfit operator` as a real process (the way it runs in the pod), with `env` added to its
    environment (the chart's MEMFIT_* settings); stopped on exit."""
    proc, port = start_operator(kubeconfig, log_path, *extra, pod_runner=pod_runner, trainer_image=trainer_image,
                                env=env)
    try:
        yield proc, port
    finally:
        stop_operator(proc)


def apply_pools(kube: Kube) -> None:
    """GPUNodePools for the KWOK pools (hack/kwok/gpunodepools.yaml), created or replaced."""
    custom = client.CustomObjectsApi(kube.api_client)
    for doc in yaml.safe_load_all((REPO / "hack" / "kwok" / "gpunodepools.yaml").read_text()):
        name = doc["metadata"]["name"]
        try:
            current = custom.get_cluster_custom_object(GROUP, VERSION, "gpunodepools", name)
            doc["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            custom.replace_cluster_custom_object(GROUP, VERSION, "gpunodepools", name, doc)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise
            custom.create_cluster_custom_object(GROUP, VERSION, "gpunodepools", doc)


def quickstart(name: str = "quickstart", **spec_overrides: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name}
    for key, value in spec_overrides.items():
        doc["spec"][key] = value
    return doc


def create_job(kube: Kube, namespace: str, doc: dict[str, Any]) -> dict[str, Any]:
    custom = client.CustomObjectsApi(kube.api_client)
    result: dict[str, Any] = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, doc)
    return result


def get_job(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(kube.api_client)
    try:
        result: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, name)
        return result
    except client.exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise


def wait_phase(
    kube: Kube,
    namespace: str,
    name: str,
    phases: tuple[str, ...],
    timeout: float,
    operator_log: Path | None = None,
) -> dict[str, Any]:
    """Wait for the job's phase; on timeout include the job status and the operator log tail."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        job = get_job(kube, namespace, name)
        if job and (job.get("status") or {}).get("phase") in phases:
            return job
        time.sleep(0.5)
    tail = operator_log.read_text()[-4000:] if operator_log and operator_log.exists() else ""
    raise AssertionError(
        f"{namespace}/{name} not in {phases} after {timeout:.0f}s; status: "
        f"{yaml.safe_dump((job or {}).get('status'))}\noperator log:\n{tail}\n{kube.logs()}"
    )


def jobs_named(kube: Kube, namespace: str, prefix: str) -> list[str]:
    return sorted(
        j.metadata.name
        for j in kube.batch.list_namespaced_job(namespace).items
        if j.metadata.name.startswith(prefix)
    )

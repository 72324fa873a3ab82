"""The real Kueue manager against the local test cluster: CRDs, webhooks and one manager process on 127.0.0.1.

How the API server reaches Kueue's webhooks (docs/kueue.md, "The test bed"): Kueue manages its own
certificates as in a cluster (internalCertManagement: a Secret in `kueue-system`, a serving cert for
`kueue-webhook-service.kueue-system.svc`, CA bundles injected into the webhook configurations and the
conversion CRDs). In a pod the kubelet mounts that Secret at the webhook's certDir; here a thread of the
test bed plays that part (`_mirror_secret`: it copies the Secret's keys into certDir as they change). The
Service `kueue-webhook-service` is of type ExternalName `127.0.0.1`: the API
server's service resolver turns an ExternalName into `https://<externalName>:<port of the clientConfig>`
while TLS still verifies the service's DNS name, so Kueue's own certificate is valid and nothing is
patched behind Kueue's back. The port in every clientConfig is the manager's webhook port on this run.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memfit_testbed.paths import testbin_dir
from memfit_testbed.testcluster import _die_with_parent, free_port

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"  # Kueue's default; the webhook configuration names derive from it
SECRET = "kueue-webhook-server-cert"
WEBHOOK_CONFIGS = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
# The conversion webhooks Kueue's kustomize patches enable (config/components/crd/kustomization.yaml).
CONVERSION_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# Only these API groups have handlers with the batch/job integration alone; a webhook for a framework
# that is off would point at a path Kueue does not serve, and failurePolicy Fail would refuse the object.
WEBHOOK_GROUPS = {"kueue.x-k8s.io", "batch"}
# The visibility API server (on by default) wants to be an aggregated API behind a Service; not needed.
FEATURE_GATES = "VisibilityOnDemand=false"


class KueueError(RuntimeError):
    """Kueue is missing or did not become ready."""


def find_kueue_dir() -> Path:
    """Kueue's folder (bin/kueue, config/crd, config/webhook): $MEMFIT_KUEUE_DIR, else install-testbin's."""
    return testbin_dir("--print-kueue-dir", "MEMFIT_KUEUE_DIR")


def missing_kueue(kueue_dir: Path) -> str | None:
    """Why Kueue cannot start from `kueue_dir`, or None."""
    if not os.access(kueue_dir / "bin" / "kueue", os.X_OK):
        return f"missing {kueue_dir / 'bin' / 'kueue'}: run hack/install-testbin.sh"
    if not list((kueue_dir / "config" / "crd").glob("*.yaml")):
        return f"missing Kueue CRDs in {kueue_dir / 'config' / 'crd'}: run hack/install-testbin.sh"
    return None


def manager_config(*, webhook_port: int, metrics_port: int, health_port: int, cert_dir: Path,
                   pods_ready_timeout: int | None = None,
                   device_class_mappings: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Kueue's Configuration: batch/Job only, everything on 127.0.0.1, no leader election; with
    `pods_ready_timeout`, WaitForPodsReady: a Workload whose pods are not all ready that many seconds
    after admission is evicted and requeued (back-off 1 s, 2 s, 4 s ... at most 10 s; admission not blocked);
    with `device_class_mappings`, Kueue charges DRA devices of those DeviceClasses to those resources
    (`resources.deviceClassMappings`, what `memfit kueue flavors` prints for DRA pools)."""
    wait = {} if pods_ready_timeout is None else {"waitForPodsReady": {
        "timeout": f"{pods_ready_timeout}s", "blockAdmission": False,
        "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 1, "backoffMaxSeconds": 10}}}
    if device_class_mappings:
        wait["resources"] = {"deviceClassMappings": [dict(m) for m in device_class_mappings]}
    return {**wait,
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 100, "burst": 200},
    }


def webhook_configurations(manifests: str, port: int) -> list[dict[str, Any]]:
    """Kueue's webhook configurations (config/components/webhook/manifests.yaml) as kustomize would name
    them, limited to WEBHOOK_GROUPS, every clientConfig pointing at SERVICE:`port`."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        hooks = []
        for hook in doc["webhooks"]:
            if not all(set(rule["apiGroups"]) <= WEBHOOK_GROUPS for rule in hook["rules"]):
                continue
            svc = hook["clientConfig"]["service"]
            hook["clientConfig"] = {"service": {"name": SERVICE, "namespace": NAMESPACE,
                                               "path": svc["path"], "port": port}}
            hooks.append(hook)
        out.append({"apiVersion": doc["apiVersion"], "kind": doc["kind"],
                    "metadata": {"name": WEBHOOK_CONFIGS[doc["kind"]]}, "webhooks": hooks})
    return out


def crds_with_conversion(crd_dir: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs, the CONVERSION_CRDS with their conversion webhook on SERVICE:`port` (the kustomize
    patch webhook_in_*.yaml; Kueue injects the CA bundle)."""
    out = []
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERSION_CRDS:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": SERVICE, "namespace": NAMESPACE, "path": "/convert",
                                             "port": port}}}}
        out.append(crd)
    return out


@dataclass
class KueueManager:
    """Kueue on the cluster whose kubeconfig is given: start() installs and runs it, stop() ends it and
    removes its webhook configurations (failurePolicy Fail would otherwise refuse every Job)."""

    kubeconfig: Path
    workdir: Path
    kueue_dir: Path | None = None
    die_with_parent: bool = True
    pods_ready_timeout: int | None = None  # WaitForPodsReady's timeout (seconds); None: off
    device_class_mappings: Sequence[dict[str, Any]] = ()  # Configuration resources.deviceClassMappings
    pid: int | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.workdir / "kueue.log"

    def start(self, timeout: float = 120.0) -> float:
        """Install CRDs, Service and webhooks, start the manager, wait until a webhook call succeeds."""
        t0 = time.monotonic()
        kueue_dir = self.kueue_dir or find_kueue_dir()
        if why := missing_kueue(kueue_dir):
            raise KueueError(why)
        self.kueue_dir = kueue_dir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = {"webhook": free_port(), "metrics": free_port(), "health": free_port()}
        cert_dir = self.workdir / "certs"
        cert_dir.mkdir(exist_ok=True)
        self._install(kueue_dir)
        cfg = manager_config(webhook_port=self.ports["webhook"], metrics_port=self.ports["metrics"],
                             health_port=self.ports["health"], cert_dir=cert_dir,
                             pods_ready_timeout=self.pods_ready_timeout,
                             device_class_mappings=self.device_class_mappings)
        cfg_path = self.workdir / "kueue-config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        cmd = [str(kueue_dir / "bin" / "kueue"), f"--config={cfg_path}", f"--kubeconfig={self.kubeconfig}",
               f"--feature-gates={FEATURE_GATES}", "--zap-log-level=2"]
        with open(self.log, "ab") as log:
            log.write(("+ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
                preexec_fn=_die_with_parent(signal.SIGKILL) if self.die_with_parent else None,
            )
        self.pid = proc.pid
        self._proc = proc
        self._stop_mirror = threading.Event()
        self._mirror = threading.Thread(target=self._mirror_secret, args=(cert_dir,), daemon=True,
                                        name="kueue-cert-mount")
        self._mirror.start()
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the manager (SIGKILL after `grace`), then delete the webhook configurations and turn the
        CRDs' conversion webhook off (the CRDs stay: Kueue's objects keep finalizers only its manager removes;
        a conversion webhook on a closed port has the API server's watch cache retry every second)."""
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.pid = None
        if getattr(self, "_mirror", None) is not None:
            self._stop_mirror.set()
            self._mirror.join(timeout=5)
        for kind, name in WEBHOOK_CONFIGS.items():
            self._kubectl("delete", kind.lower(), name, "--ignore-not-found", "--wait=false")
        if getattr(self, "_installed", False):
            no_conversion = json.dumps({"spec": {"conversion": {"strategy": "None", "webhook": None}}})
            for plural in CONVERSION_CRDS:
                with contextlib.suppress(KueueError):  # best effort: the rest of the teardown still runs
                    self._kubectl("patch", "crd", f"{plural}.kueue.x-k8s.io", "--type=merge", "-p", no_conversion)

    def running(self) -> bool:
        proc = getattr(self, "_proc", None)
        return proc is not None and proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:] if self.log.exists() else []
        return f"===== {self.log} (last {len(text)} lines) =====\n" + "\n".join(text)

    # --- steps -----------------------------------------------------------------------------------

    def _install(self, kueue_dir: Path) -> None:
        port = self.ports["webhook"]
        crds = crds_with_conversion(kueue_dir / "config" / "crd", port)
        self._apply(crds)
        self._installed = True
        names = [f"crd/{c['metadata']['name']}" for c in crds]
        self._kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
                   "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}}
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        # Kueue's rotator fills this Secret but does not create it (config/components/internalcert).
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE},
                  "type": "Opaque"}
        self._apply([namespace])
        self._apply([service, secret])
        manifests = (kueue_dir / "config" / "webhook" / "manifests.yaml").read_text()
        self._apply(webhook_configurations(manifests, port))

    def _mirror_secret(self, cert_dir: Path, interval: float = 0.5) -> None:
        """Stand in for the kubelet's Secret volume: write the Secret's keys into `cert_dir` (atomically,
        by rename) whenever they change, until stop()."""
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))
        seen: dict[str, str | bytes] = {}
        while not self._stop_mirror.wait(interval):
            try:
                data = core.read_namespaced_secret(SECRET, NAMESPACE).data or {}
            except Exception:  # the API server may restart under a test; the next poll retries
                continue
            for key, value in data.items():
                if seen.get(key) != value:
                    tmp = cert_dir / f".{key}.tmp"
                    tmp.write_bytes(base64.b64decode(value))
                    tmp.replace(cert_dir / key)
                    seen[key] = value

    def _wait_ready(self, timeout: float) -> None:
        """Ready = /readyz (webhook server started after the certificates) and a dry-run ResourceFlavor
        create that passes both of Kueue's webhooks through the API server."""
        deadline = time.monotonic() + timeout
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "memfit-testbed-webhook-probe"}}
        last = ""
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise KueueError(f"kueue exited with {self._proc.returncode}\n{self.log_tail()}")
            if _http_status(f"http://127.0.0.1:{self.ports['health']}/readyz") == 200:
                res = subprocess.run(["kubectl", "create", "--dry-run=server", "-o", "name", "-f", "-"],
                                     input=json.dumps(probe), capture_output=True, text=True, env=self._env())
                if res.returncode == 0:
                    return
                last = res.stderr.strip()
            time.sleep(0.3)
        raise KueueError(f"Kueue not ready after {timeout:.0f}s (last webhook probe: {last or 'readyz not 200'})"
                         f"\n{self.log_tail()}")

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def _apply(self, docs: list[dict[str, Any]]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        self._kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=memfit-testbed",
                      "-f", "-", stdin=body)

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        res = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, env=self._env())
        if res.returncode != 0:
            raise KueueError(f"kubectl {' '.join(args[:3])}: {res.stderr.strip()}")
        return res.stdout


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ssl.SSLError):
        return 0


@contextlib.contextmanager
def running_kueue(kubeconfig: Path, workdir: Path, **kwargs: Any) -> Iterator[KueueManager]:
    """Context manager: Kueue started on the cluster of `kubeconfig`, stopped (webhooks removed) on exit."""
    manager = KueueManager(kubeconfig=kubeconfig, workdir=workdir, **kwargs)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m memfit_testbed.kueue --dir DIR`: run Kueue on the test cluster in DIR until Ctrl-C."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("MEMFIT_TESTCLUSTER_DIR", "/tmp/memfit-testcluster")))
    args = ap.parse_args(argv)
    workdir = args.dir.resolve()
    manager = KueueManager(kubeconfig=workdir / "kubeconfig", workdir=workdir / "kueue", die_with_parent=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        secs = manager.start()
    except KueueError as e:
        print(f"kueue: {e}", file=sys.stderr)
        return 1
    print(f"kueue ready in {secs:.1f}s (webhook 127.0.0.1:{manager.ports['webhook']}); Ctrl-C stops it",
          file=sys.stderr)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        manager.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

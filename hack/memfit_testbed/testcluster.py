"""Local Kubernetes control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) on 127.0.0.1."""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memfit_testbed.paths import KWOK, testbin_dir

DEFAULT_DIR = Path(os.environ.get("MEMFIT_TESTCLUSTER_DIR", "/tmp/memfit-testcluster"))
DEFAULT_STAGES = KWOK / "stages.yaml"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.0.0.0/24"


class ClusterError(RuntimeError):
    """A component failed to start or become ready."""


def find_bin_dir() -> Path:
    """The test binaries' folder: $MEMFIT_TESTBIN_DIR, else the one hack/install-testbin.sh builds into."""
    return testbin_dir("--print-dir", "MEMFIT_TESTBIN_DIR")


def missing_binaries(bin_dir: Path) -> list[str]:
    """Names of the binaries the cluster needs that are not executable in bin_dir."""
    return [c for c in COMPONENTS if not os.access(bin_dir / c, os.X_OK)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork: no dlopen in the child


def _die_with_parent(sig: int) -> Callable[[], None]:
    """preexec_fn: signal the child when the thread that started it exits (Linux PR_SET_PDEATHSIG)."""
    return lambda: _PRCTL(1, sig)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """CA, apiserver serving cert (127.0.0.1, localhost), admin client cert (system:masters), sa.key."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=memfit-testcluster-ca", cwd=pki)
    sans = ("IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
    certs = {
        "serving": ("/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"),
        "admin": ("/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subj, ext) in certs.items():
        (pki / f"{name}.ext").write_text("keyUsage=critical,digitalSignature,keyEncipherment\n" + ext)
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subj, cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "3650", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    """A kubeconfig for the admin user with the certificates embedded (JSON is valid YAML)."""
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "memfit-test",
        "clusters": [{"name": "memfit-test",
                      "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"),
                                             "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": "memfit-test", "context": {"cluster": "memfit-test", "user": "admin"}}],
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    path.chmod(0o600)


@dataclass
class TestCluster:
    """One local cluster in `workdir`: start() brings it up, stop() ends exactly the PIDs it started."""

    __test__ = False  # not a pytest test class

    workdir: Path = DEFAULT_DIR
    bin_dir: Path | None = None
    stages: Path = DEFAULT_STAGES
    pod_runner: bool = True
    die_with_parent: bool = False
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> float:
        """Start every component and wait until the cluster serves pods; returns the seconds it took."""
        t0 = time.monotonic()
        if self.running():
            raise ClusterError(f"a cluster is already running in {self.workdir} (pids {self.pids})")
        bin_dir = self.bin_dir or find_bin_dir()
        if missing := missing_binaries(bin_dir):
            raise ClusterError(f"missing {missing} in {bin_dir}: run hack/install-testbin.sh")
        self.bin_dir = bin_dir
        for sub in ("pki", "etcd", "logs", "pod-runner"):
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        self.logs.mkdir(parents=True)
        self.pids, self.ports = {}, {}
        try:
            make_pki(self.pki)
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            write_kubeconfig(self.kubeconfig, self.server, self.pki)
            self._start_controllers()
            self._wait(lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
                       timeout, "the default ServiceAccount (kube-controller-manager)")
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def stop(self, grace: float = 10.0) -> None:
        """Stop the recorded PIDs in reverse start order (clients first, etcd last): SIGTERM, then
        SIGKILL after `grace` seconds each. PIDs that no longer run our command line are left alone."""
        if not self.pids and self.state_file.exists():
            self._load_state()
        order = [n for n in reversed(list(self.pids)) if self._ours(self.pids[n])]
        clients = [n for n in order if n not in ("kube-apiserver", "etcd")]
        for group in (clients, ["kube-apiserver"], ["etcd"]):
            names = [n for n in group if n in order]
            for name in names:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pids[name], signal.SIGTERM)
            deadline = time.monotonic() + grace
            for name in names:
                while self._alive(self.pids[name]) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if self._alive(self.pids[name]):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pids[name], signal.SIGKILL)
                with contextlib.suppress(ChildProcessError, OSError):  # reap if it is our child
                    os.waitpid(self.pids[name], 0)
        self.pids = {}
        self.state_file.unlink(missing_ok=True)

    def restart_apiserver(self, downtime: float = 0.0, timeout: float = 120.0) -> float:
        """Stop kube-apiserver (SIGTERM, SIGKILL after 10 s), wait `downtime` seconds, start it again on the
        same port with the same certificates (etcd, and so every object, is kept); returns the seconds
        the API was down. Clients (controllers, kwok, the pod runner, an operator) reconnect by themselves."""
        if not self.pids and self.state_file.exists():
            self._load_state()
        pid = self.pids.get("kube-apiserver")
        if pid is None or not self._ours(pid):
            raise ClusterError(f"no kube-apiserver of {self.workdir} is running")
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while self._alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):  # reap if it is our child
            os.waitpid(pid, 0)
        del self.pids["kube-apiserver"]
        time.sleep(downtime)
        self._start_apiserver(timeout, port=self.ports["apiserver"])
        return time.monotonic() - t0

    def running(self) -> bool:
        if not self.pids and self.state_file.exists():
            self._load_state()
        return any(self._ours(pid) for pid in self.pids.values())

    def env(self) -> dict[str, str]:
        return {"KUBECONFIG": str(self.kubeconfig)}

    def status(self) -> dict[str, object]:
        if not self.pids and self.state_file.exists():
            self._load_state()
        return {"workdir": str(self.workdir), "server": self.server if self.ports else None,
                "components": {n: {"pid": p, "alive": self._ours(p)} for n, p in self.pids.items()}}

    def log_tail(self, lines: int = 40, names: Sequence[str] | None = None) -> str:
        """The last `lines` lines of each component log, for failing tests to print."""
        out = []
        for log in sorted(self.logs.glob("*.log")):
            if names and log.stem not in names:
                continue
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"===== {log} (last {len(text)} lines) =====\n" + "\n".join(text))
        return "\n".join(out)

    # --- components ------------------------------------------------------------------------------

    def _start_etcd(self, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self.ports.update(etcd=client, etcd_peer=peer)
        c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            "--name=n0", f"--data-dir={self.workdir / 'etcd'}", f"--listen-client-urls={c}",
            f"--advertise-client-urls={c}", f"--listen-peer-urls={p}", f"--initial-advertise-peer-urls={p}",
            f"--initial-cluster=n0={p}", "--unsafe-no-fsync", "--quota-backend-bytes=4294967296",
            "--auto-compaction-retention=1", "--log-level=warn",
        ])
        self._wait(lambda: _http_ok(f"{c}/health"), timeout, "etcd /health", "etcd")

    def _start_apiserver(self, timeout: float, port: int | None = None) -> None:
        port = port or free_port()
        self.ports["apiserver"] = port
        pki = self.pki
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={pki / 'serving.crt'}", f"--tls-private-key-file={pki / 'serving.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--allow-privileged=true", "--max-requests-inflight=0", "--max-mutating-requests-inflight=0",
            "--enable-priority-and-fairness=false", f"--cert-dir={pki}",
            "--endpoint-reconciler-type=none",  # Endpoints may not hold 127.0.0.1: skip the kubernetes svc
            # `kubectl logs` on a real node (docs/realnode.md): reach its kubelet by InternalIP, as admin.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki / 'admin.crt'}", f"--kubelet-client-key={pki / 'admin.key'}",
        ])
        self._wait(lambda: self._get("/readyz") == 200, timeout, "kube-apiserver /readyz", "kube-apiserver")

    def _start_controllers(self) -> None:
        kc, pki = str(self.kubeconfig), self.pki
        fast = ["--kube-api-qps=1000", "--kube-api-burst=1000", "--leader-elect=false", "--secure-port=0"]
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kc}", *fast, f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--bind-address=127.0.0.1",
            "--node-monitor-grace-period=40s",
        ])
        self._spawn("kube-scheduler", [f"--kubeconfig={kc}", *fast, "--bind-address=127.0.0.1"])
        self.ports["kwok"] = free_port()
        self._spawn("kwok", [
            f"--kubeconfig={kc}", "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--node-lease-duration-seconds=40", "--cidr=10.244.0.0/16", "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{self.ports['kwok']}", f"--config={self.stages}",
        ])
        env = {**os.environ, "KUBECONFIG": kc, "PYTHONUNBUFFERED": "1"}
        # The default StorageClass memfit-local: binds claims (memfit's checkpoint PVCs) to hostPath
        # volumes in the folders the pod runner mounts (memfit_testbed.provisioner).
        self._spawn("provisioner", ["-m", "memfit_testbed.provisioner", f"--kubeconfig={kc}",
                                    f"--root={self.workdir / 'pod-runner' / 'claims'}"],
                    exe=sys.executable, env=env)
        if self.pod_runner:
            self._spawn("pod-runner", ["-m", "memfit_testbed.pod_runner", f"--kubeconfig={kc}",
                                       f"--workdir={self.workdir / 'pod-runner'}"],
                        exe=sys.executable, env=env)

    # --- helpers ---------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], exe: str | None = None,
               env: dict[str, str] | None = None) -> None:
        assert self.bin_dir is not None
        cmd = [exe or str(self.bin_dir / name), *args]
        with open(self.logs / f"{name}.log", "ab") as log:
            log.write(("+ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                env=env, start_new_session=not self.die_with_parent,
                # SIGKILL: etcd and kube-apiserver hang when both get SIGTERM at once; the pod runner
                # gets SIGTERM to end its pods' process groups.
                preexec_fn=_die_with_parent(signal.SIGTERM if exe else signal.SIGKILL)
                if self.die_with_parent else None,
            )
        self.pids[name] = proc.pid
        self._save_state()

    def _save_state(self) -> None:
        state = {"pids": self.pids, "ports": self.ports, "bin_dir": str(self.bin_dir)}
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    def _load_state(self) -> None:
        state = json.loads(self.state_file.read_text())
        self.pids = {k: int(v) for k, v in state["pids"].items()}
        self.ports = {k: int(v) for k, v in state["ports"].items()}
        self.bin_dir = Path(state["bin_dir"])

    def _ours(self, pid: int) -> bool:
        """Alive and still running a command line that mentions our workdir (guards against PID reuse)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] != "Z" and str(self.workdir).encode() in cmdline

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
        except OSError:
            return False

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _get(self, path: str) -> int:
        """HTTP status of an admin GET against the API server (0 when it does not answer)."""
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (OSError, ssl.SSLError):
            return 0

    def _wait(self, ok: Callable[[], bool], timeout: float, what: str, component: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            dead = [n for n, p in self.pids.items() if not self._alive(p)]
            if dead:
                raise ClusterError(f"{dead} exited while waiting for {what}\n{self.log_tail(30, dead)}")
            time.sleep(0.2)
        names = [component] if component else None
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.log_tail(30, names)}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_cluster(workdir: Path, **kwargs: object) -> Iterator[TestCluster]:
    """Context manager: a started TestCluster that is stopped on exit."""
    cluster = TestCluster(workdir=workdir, **kwargs)  # type: ignore[arg-type]
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def stop_real_node(workdir: Path) -> list[str]:
    """Stop the real node of the cluster in `workdir` (or one whose cluster is gone) and undo its host
    changes; nothing when the machine has none."""
    from memfit_testbed.realnode import hostchanges

    state = hostchanges.load_state()
    if not state and not hostchanges.remaining():
        return []
    if state and state.get("cluster_dir") not in (str(workdir), None):
        from memfit_testbed.realnode.node import _cluster_alive

        if _cluster_alive(state):
            return []  # another running cluster's node
    return hostchanges.undo_all() or ["nothing left"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("command", choices=["up", "down", "env", "status", "logs"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"cluster folder (default {DEFAULT_DIR})")
    ap.add_argument("--no-pod-runner", action="store_true", help="do not start the local pod runner")
    ap.add_argument("--no-pools", action="store_true", help="skip hack/kwok/gpu-pools.yaml")
    ap.add_argument("--real-node", action="store_true",
                    help="add a real node (kubelet + containerd) standing in for a GPU pool (docs/realnode.md)")
    ap.add_argument("--real-node-pool", default="t4-spot", help="the pool whose KWOK nodes the real node replaces")
    args = ap.parse_args(argv)
    cluster = TestCluster(workdir=args.dir.resolve(), pod_runner=not args.no_pod_runner)
    if args.command == "up":
        try:
            secs = cluster.start()
        except ClusterError as e:
            print(f"testcluster: {e}", file=sys.stderr)
            return 1
        msg = f"cluster up in {secs:.1f}s: {cluster.server}"
        if not args.no_pools:
            from memfit_testbed import kwok_pools  # needs the kubernetes client (the project venv)

            nodes = kwok_pools.apply_pools(str(cluster.kubeconfig))
            msg += f", {len(nodes)} kwok nodes Ready"
        if args.real_node:
            from memfit_testbed.realnode.node import RealNode

            node = RealNode(cluster_dir=cluster.workdir, apiserver_port=cluster.ports["apiserver"],
                            pool=args.real_node_pool)
            try:
                secs = node.start()  # undoes its own host changes when it fails
            except Exception as e:
                print(f"testcluster: real node: {type(e).__name__}: {e}", file=sys.stderr)
                cluster.stop()
                return 1
            msg += f", real node {node.node_name} (pool {node.pool}) Ready in {secs:.1f}s"
        print(f"{msg}\nexport KUBECONFIG={cluster.kubeconfig}", file=sys.stderr)
    elif args.command == "down":
        was = cluster.running()
        undone = stop_real_node(cluster.workdir)
        cluster.stop()
        print("stopped" if was else "nothing running", file=sys.stderr)
        if undone:
            print("real node: " + "; ".join(undone), file=sys.stderr)
    elif args.command == "env":
        print(f"export KUBECONFIG={cluster.kubeconfig}")
    elif args.command == "logs":
        print(cluster.log_tail(60))
    else:
        print(json.dumps(cluster.status(), indent=2))
        return 0 if cluster.running() else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One real node for the test cluster: containerd + CNI bridge + kubelet + kube-proxy + CoreDNS.

The node joins a running `TestCluster` as a CPU stand-in for one GPUNodePool: it carries that pool's
labels and taint and advertises `nvidia.com/gpu`, and the pool's KWOK nodes are removed so memfit's pods
for that pool run here as real containers. Networking stays on this machine: pods live on the bridge
`memfit0` (10.89.0.0/24, gateway 10.89.0.1 = the node's address), Services go through kube-proxy
(nftables), cluster DNS is CoreDNS on 10.89.0.1:53, and a forwarder on 10.89.0.1 takes in-cluster
clients to the API server on 127.0.0.1. Every host change is undone by `hostchanges.undo_all()`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit_testbed.realnode import hostchanges as host
from memfit_testbed.realnode.hostchanges import BRIDGE, CGROUP_ROOT, KUBELET_ROOT, RUN
from memfit_testbed.realnode.images import CACHE, PAUSE_IMAGE, Images, ensure_images
from memfit_testbed.testcluster import free_port

NODE_IP = "10.89.0.1"
POD_CIDR = "10.89.0.0/24"
APISERVER_PORT = 6443  # the forwarder's port on NODE_IP (the `kubernetes` Service's endpoint)
CNI_NAME = "memfit-realnode"
NODE_NAME = "memfit-real-0"
DEFAULT_POOL = "t4-spot"
IMAGES_VALUES = "realnode-images.yaml"  # in the cluster's folder: Helm values naming the node's images


class NodeError(RuntimeError):
    """The real node could not start."""


def node_bin_dir() -> Path:
    """The kubelet's, kube-proxy's and CoreDNS's folder: $MEMFIT_NODEBIN_DIR, else install-testbin's."""
    from memfit_testbed.paths import testbin_dir

    return testbin_dir("--print-node-dir", "MEMFIT_NODEBIN_DIR")


def unsupported_reason() -> str | None:
    """Why a real node cannot run on this machine (None when it can): the capability check."""
    if os.geteuid() != 0:
        return "not root (the kubelet, containerd and the CNI bridge need root)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/memory.max").exists():
        return "no memory cgroup controller"
    missing = [b for b in ("containerd", "runc", "ctr", "dockerd", "debootstrap", "nft", "ip", "gcc")
               if shutil.which(b) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("CNI plugins (/usr/lib/cni)")
    if missing:
        return f"missing {', '.join(missing)}: run hack/install-realnode.sh"
    bins = node_bin_dir()
    if lacking := [b for b in ("kubelet", "kube-proxy", "coredns") if not os.access(bins / b, os.X_OK)]:
        return f"missing {lacking} in {bins}: run hack/install-testbin.sh"
    free = shutil.disk_usage(CACHE.parent if CACHE.parent.exists() else Path.home()).free
    if free < 12 * 2**30 and not (CACHE / "images.json").exists():
        return f"only {free / 2**30:.0f} GiB free for the images (the trainer image needs about 12)"
    return None


@dataclass
class RealNode:
    """The real node of the cluster whose kubeconfig and PKI are in `cluster_dir`."""

    cluster_dir: Path
    apiserver_port: int
    pool: str = DEFAULT_POOL
    gpus: int = 4
    node_name: str = NODE_NAME
    pids: dict[str, int] = field(default_factory=dict)
    images: Images | None = None

    @property
    def logs(self) -> Path:
        return self.cluster_dir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.cluster_dir / "kubeconfig"

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> float:
        """Undo what a previous run left, build/load the images, start every component, wait until the
        node is Ready with its GPUs and cluster DNS answers. Returns the seconds it took."""
        t0 = time.monotonic()
        if reason := unsupported_reason():
            raise NodeError(f"real node not supported here: {reason}")
        prev = host.load_state()
        if prev and prev.get("cluster_dir") != str(self.cluster_dir) and _cluster_alive(prev):
            raise NodeError(f"a real node of {prev.get('cluster_dir')} is running: one per machine")
        if done := host.undo_all():
            print(f"[realnode] cleaned up a previous run: {'; '.join(done)}", flush=True)
        state: dict[str, Any] = {"cluster_dir": str(self.cluster_dir), "host": host.snapshot(), "pids": {}}
        host.save_state(state)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._write_configs()
            self._make_bridge()
            self._start("containerd", ["containerd", f"--config={RUN / 'containerd.toml'}"])
            self._wait(lambda: (RUN / "containerd.sock").exists(), 30, "containerd's socket")
            self.images = ensure_images(load_into=RUN / "containerd.sock")
            self._write_images_values()
            self._start("forward", [sys.executable, "-m", "memfit_testbed.realnode.forward",
                                    f"{NODE_IP}:{APISERVER_PORT}", f"127.0.0.1:{self.apiserver_port}",
                                    f"--tag={RUN}"])
            self._ensure_kubernetes_endpoints()
            self._start("coredns", [str(node_bin_dir() / "coredns"), "-conf", str(RUN / "Corefile")])
            self._start("kube-proxy", self._kube_proxy_args())
            for cg in Path("/sys/fs/cgroup").iterdir():  # the kubelet wants its cgroupRoot to exist
                if cg.is_dir() and not (cg / CGROUP_ROOT).exists():
                    (cg / CGROUP_ROOT).mkdir()
            self._start("kubelet", [str(node_bin_dir() / "kubelet"), f"--config={RUN / 'kubelet.yaml'}",
                                    f"--kubeconfig={RUN / 'kubeconfig'}", f"--root-dir={KUBELET_ROOT}",
                                    f"--hostname-override={self.node_name}", f"--node-ip={NODE_IP}",
                                    f"--node-labels={self._labels()}", "--v=1"])
            self._join_pool(timeout)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def stop(self) -> list[str]:
        """Stop the node's processes and undo every host change (see hostchanges)."""
        return host.undo_all()

    def local_volume(self, namespace: str, claim: str, size: str = "1Gi") -> Path:
        """A PersistentVolumeClaim bound to a hostPath PersistentVolume on this node (static provisioning:
        the folder lives under the kubelet's root, which the teardown removes); returns the folder."""
        from memfit_testbed.realnode.volumes import ensure_local_volume

        return ensure_local_volume(self._api(), namespace=namespace, claim=claim, node_name=self.node_name,
                                   size=size)

    @property
    def images_values(self) -> Path:
        """The Helm values file naming the node's operator and trainer images (written by start())."""
        return self.cluster_dir / IMAGES_VALUES

    def _write_images_values(self) -> None:
        import yaml

        assert self.images is not None
        header = ("# charts/memfit values: the operator and trainer images this machine built and loaded into\n"
                  f"# the real node {self.node_name} (written by `hack/testcluster up --real-node`; docs/realnode.md).\n")
        self.images_values.write_text(header + yaml.safe_dump(self.images.helm_values(), sort_keys=False))

    # --- configuration ---------------------------------------------------------------------------

    def _write_configs(self) -> None:
        RUN.mkdir(parents=True, exist_ok=True)
        (RUN / "net.d").mkdir(exist_ok=True)
        # The components read the cluster's admin kubeconfig from RUN (so each command line names RUN).
        shutil.copy2(self.kubeconfig, RUN / "kubeconfig")
        (RUN / "containerd.toml").write_text(f"""version = 2
root = "{CACHE / 'containerd'}"
state = "{RUN / 'containerd'}"
[grpc]
  address = "{RUN / 'containerd.sock'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{RUN / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true   # this VM lacks CAP_SYS_RESOURCE (docs/realnode.md)
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{RUN / 'net.d'}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
""")
        (RUN / "net.d" / "10-memfit.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": CNI_NAME,
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(RUN / "ipam"),
                          "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP, "rangeStart": "10.89.0.10"}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": False},
            ]}, indent=2))
        (RUN / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
        (RUN / "Corefile").write_text(f""".:53 {{
    bind {NODE_IP}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {RUN / 'kubeconfig'} memfit-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
""")
        (RUN / "kubelet.yaml").write_text(json.dumps({
            "kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "failCgroupV1": False,  # this machine has cgroup v1 (docs/realnode.md)
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP_ROOT}",
            "containerRuntimeEndpoint": f"unix://{RUN / 'containerd.sock'}",
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cluster_dir / "pki" / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [NODE_IP], "clusterDomain": "cluster.local", "resolvConf": str(RUN / "resolv.conf"),
            "registerWithTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            # Never evict or garbage-collect images for disk: the images are built here, not pulled.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "maxPods": 30, "failSwapOn": False,
            "protectKernelDefaults": False, "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "5s", "fileCheckFrequency": "5s",
        }, indent=2))

    def _make_bridge(self) -> None:
        # Made here, before anything starts, so the node address exists for the kubelet, CoreDNS and the
        # forwarder; the CNI bridge plugin adopts it.
        for cmd in (["ip", "link", "add", BRIDGE, "type", "bridge"], ["ip", "addr", "add", f"{NODE_IP}/24",
                    "dev", BRIDGE], ["ip", "link", "set", BRIDGE, "up"]):
            result = host.sh(*cmd)
            if result.returncode != 0 and "File exists" not in result.stderr:
                raise NodeError(f"{' '.join(cmd)}: {result.stderr.strip()}")

    def _kube_proxy_args(self) -> list[str]:
        return [str(node_bin_dir() / "kube-proxy"), f"--kubeconfig={RUN / 'kubeconfig'}",
                f"--hostname-override={self.node_name}", "--proxy-mode=nftables", f"--cluster-cidr={POD_CIDR}",
                f"--nodeport-addresses={NODE_IP}/32", f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--healthz-bind-address=127.0.0.1:{free_port()}",
                # Leave the host's conntrack sysctls alone.
                "--conntrack-max-per-core=0", "--conntrack-min=0",
                "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"]

    def _labels(self) -> str:
        from memfit_testbed.kwok_pools import load_pools

        labels = dict(load_pools()[self.pool].node(0)["metadata"]["labels"])
        for key in ("kubernetes.io/hostname", "type", "kubernetes.io/os", "kubernetes.io/arch"):
            labels.pop(key, None)
        labels["nvidia.com/gpu.count"] = str(self.gpus)
        labels["memfit.dev/real-node"] = "true"
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

    # --- cluster objects -------------------------------------------------------------------------

    def _api(self) -> Any:
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))

    def _ensure_kubernetes_endpoints(self) -> None:
        """The `kubernetes` Service's EndpointSlice: the forwarder (the API server runs with
        --endpoint-reconciler-type=none because it listens on loopback)."""
        from kubernetes import client, config

        api = client.DiscoveryV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))
        body: Any = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": "default",
                             "labels": {"kubernetes.io/service-name": "kubernetes",
                                        "endpointslice.kubernetes.io/managed-by": "memfit-realnode"}},
                "addressType": "IPv4", "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": APISERVER_PORT, "protocol": "TCP"}]}
        try:
            api.create_namespaced_endpoint_slice("default", body)
        except client.exceptions.ApiException as e:
            if e.status != 409:
                raise
            api.replace_namespaced_endpoint_slice("kubernetes", "default", body)

    def _join_pool(self, timeout: float) -> None:
        """Wait for the node, give it its GPUs, remove the pool's KWOK nodes, wait until Ready."""
        from memfit_testbed import kwok_pools

        api = self._api()
        self._wait(lambda: bool(kwok_pools.pool_nodes(api, self.pool).count(self.node_name)), timeout,
                   f"node {self.node_name} to register")
        api.patch_node_status(self.node_name, [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu",
                                                "value": str(self.gpus)}],
                              _content_type="application/json-patch+json")
        for name in kwok_pools.pool_nodes(api, self.pool):
            if name != self.node_name:
                kwok_pools.delete_node(api, name)

        def ready() -> bool:
            node = kwok_pools._raw(api.read_node, self.node_name)
            alloc = node["status"].get("allocatable", {})
            conds = node["status"].get("conditions") or []
            taints = [t["key"] for t in (node["spec"].get("taints") or []) if t["key"].startswith("node.")]
            return alloc.get("nvidia.com/gpu") == str(self.gpus) and not taints and any(
                c["type"] == "Ready" and c["status"] == "True" for c in conds)

        self._wait(ready, timeout, f"node {self.node_name} Ready with {self.gpus} nvidia.com/gpu")

    # --- processes -------------------------------------------------------------------------------

    def _start(self, name: str, cmd: list[str]) -> None:
        with open(self.logs / f"realnode-{name}.log", "ab") as log:
            log.write(("+ " + " ".join(cmd) + "\n").encode())
            log.flush()
            env = {**os.environ, "PATH": f"/usr/sbin:/usr/bin:/sbin:/bin:{os.environ.get('PATH', '')}"}
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=RUN, env=env, start_new_session=True)
        self.pids[name] = proc.pid
        state = host.load_state()
        state["pids"] = self.pids
        host.save_state(state)

    def _wait(self, ok: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except Exception:  # the API or a file may not be there yet
                pass
            for name, pid in self.pids.items():
                if not Path(f"/proc/{pid}").exists() or _zombie(pid):
                    raise NodeError(f"{name} exited while waiting for {what}\n{self.log_tail(name)}")
            time.sleep(0.3)
        raise NodeError(f"timed out after {timeout:.0f}s waiting for {what}\n" +
                        "\n".join(self.log_tail(n) for n in self.pids))

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"realnode-{name}.log"
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
        return f"===== {path} =====\n" + "\n".join(text)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def _cluster_alive(state: dict[str, Any]) -> bool:
    """Whether the cluster a recorded real node belonged to still runs (its API server answers)."""
    cluster_state = Path(str(state.get("cluster_dir", ""))) / "state.json"
    try:
        pids = json.loads(cluster_state.read_text())["pids"]
        return Path(f"/proc/{int(pids['kube-apiserver'])}").exists()
    except (OSError, ValueError, KeyError):
        return False

"""Every change the real node makes to this host, and how to undo it (docs/realnode.md, "Teardown").

`undo_all()` is safe to call at any time: after a clean stop, after a run that died half-way, or with
nothing to undo. It touches only names that are the real node's own: the bridge `memfit0`, the nft tables
`kube-proxy`, the cgroup subtree `memfit-realnode`, mounts under its folders and `cni-*` network
namespaces that containerd's CRI made for its sandboxes, and the processes whose command line names its
run folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from memfit_testbed.realnode.images import pids_with_arg, stop_pid

RUN = Path("/run/memfit-realnode")  # sockets, configs, containerd state, IPAM: every process names it
KUBELET_ROOT = Path("/var/lib/memfit-kubelet")
STATE = RUN / "state.json"
BRIDGE = "memfit0"
CGROUP_ROOT = "memfit-realnode"
CGROUP_FS = Path("/sys/fs/cgroup")
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
# Kernel settings the kubelet (protectKernelDefaults: false) or the CNI bridge plugin may write.
SYSCTLS = ("net/ipv4/ip_forward", "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
           "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Folders the kubelet and libcni write outside the node's own folders (hard-coded upstream): removed at the
# end when they did not exist before.
LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"), Path("/var/lib/cni"))
IPTABLES = ("iptables", "ip6tables")


def snapshot() -> dict[str, object]:
    """What must be restored at the end: sysctl values and which kubelet log folders existed before."""
    sysctls = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[key] = (Path("/proc/sys") / key).read_text().strip()
    return {"sysctls": sysctls, "log_dirs_before": [str(d) for d in LOG_DIRS if d.exists()],
            "nft_tables_before": nft_tables()}


def nft_tables() -> list[str]:
    """`family name` of every nft table (iptables-nft makes `ip filter` etc. on first use)."""
    return [line.removeprefix("table ").strip() for line in sh("nft", "list", "tables").stdout.splitlines()
            if line.startswith("table ")]


def save_state(state: dict[str, object]) -> None:
    RUN.mkdir(parents=True, exist_ok=True)
    STATE.write_text(json.dumps(state, indent=2) + "\n")


def load_state() -> dict[str, object]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads(STATE.read_text()))
    return {}


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False)


def stop_processes() -> list[int]:
    """Every process of the real node (kubelet, kube-proxy, CoreDNS, containerd, its shims, the API
    forwarder): each names RUN in its arguments. Shims and containers die before containerd."""
    order = ("kubelet", "kube-proxy", "coredns", "forward", "containerd-shim", "containerd")
    pids = pids_with_arg(str(RUN))
    stopped = []

    def kind(pid: int) -> int:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            for i, name in enumerate(order):
                if name in Path(cmd).name or (name == "forward" and "python" in cmd):
                    return i
        return len(order)

    for pid in sorted(pids, key=kind):
        stop_pid(pid, grace=10)
        stopped.append(pid)
    return stopped


def kill_containers() -> None:
    """Stop every container task still running in containerd's k8s.io namespace (before containerd)."""
    sock = RUN / "containerd.sock"
    if not sock.exists():
        return
    tasks = sh("ctr", "-a", str(sock), "-n", "k8s.io", "tasks", "ls", "-q").stdout.split()
    for task in tasks:
        sh("ctr", "-a", str(sock), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task)
    for task in tasks:
        sh("ctr", "-a", str(sock), "-n", "k8s.io", "tasks", "delete", "-f", task)
    for container in sh("ctr", "-a", str(sock), "-n", "k8s.io", "containers", "ls", "-q").stdout.split():
        sh("ctr", "-a", str(sock), "-n", "k8s.io", "containers", "delete", container)


def unmount_under(*roots: Path) -> None:
    """Unmount (lazily, deepest first) every mount point under the given folders."""
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(r) or point.startswith(str(r) + "/") for r in roots):
                mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        sh("umount", "-l", point)


def remove_netns() -> None:
    """CRI's sandbox network namespaces (`cni-<uuid>` under /run/netns): only the real node makes them."""
    for ns in Path("/run/netns").glob("cni-*"):
        sh("umount", "-l", str(ns))
        with contextlib.suppress(OSError):
            ns.unlink()


def remove_cgroups() -> None:
    """The kubelet's cgroup subtree (cgroupRoot) in every v1 hierarchy and the unified one, deepest first."""
    for hierarchy in CGROUP_FS.iterdir():
        top = hierarchy / CGROUP_ROOT
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def remove_iptables_chains() -> list[str]:
    """The kubelet's iptables chains (KUBE-FIREWALL, which drops non-local traffic to 127.0.0.0/8, and the
    KUBE-*-CANARY / KUBE-IPTABLES-HINT markers): the jumps from built-in chains, then the chains."""
    done = []
    for tool in IPTABLES:
        dump = sh(f"{tool}-save").stdout
        table = ""
        jumps, chains = [], []
        for line in dump.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                chains.append((table, line[1:].split()[0]))
            elif line.startswith("-A ") and " -j KUBE-" in line and not line.split()[1].startswith("KUBE-"):
                jumps.append((table, line[3:]))
        for table, rule in jumps:
            sh("sh", "-c", f"{tool} -t {table} -D {rule}")
        for table, chain in chains:
            sh(tool, "-t", table, "-F", chain)
        for table, chain in chains:
            if sh(tool, "-t", table, "-X", chain).returncode == 0:
                done.append(f"{tool} -t {table} {chain}")
    return done


def restore_sysctls(saved: dict[str, str]) -> None:
    for key, value in saved.items():
        path = Path("/proc/sys") / key
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")


def remaining() -> list[str]:
    """What of the real node is still on the host (empty after a complete undo): for tests and `down`."""
    left = []
    if pids_with_arg(str(RUN)):
        left.append(f"processes naming {RUN}: {pids_with_arg(str(RUN))}")
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        left.append(f"bridge {BRIDGE}")
    for family, table in NFT_TABLES:
        if sh("nft", "list", "table", family, table).returncode == 0:
            left.append(f"nft table {family} {table}")
    for tool in IPTABLES:
        left += [f"{tool} chain {line.split()[0][1:]}" for line in sh(f"{tool}-save").stdout.splitlines()
                 if line.startswith(":KUBE-")]
    left += [f"cgroup {h / CGROUP_ROOT}" for h in CGROUP_FS.iterdir() if (h / CGROUP_ROOT).exists()]
    left += [f"netns {ns}" for ns in Path("/run/netns").glob("cni-*")] if Path("/run/netns").exists() else []
    left += [str(p) for p in (RUN, KUBELET_ROOT) if p.exists()]
    with contextlib.suppress(OSError):
        mounts = Path("/proc/self/mountinfo").read_text()
        left += [f"mount under {r}" for r in (RUN, KUBELET_ROOT) if f" {r}/" in mounts or f" {r} " in mounts]
    return left


def undo_all() -> list[str]:
    """Undo every host change of the real node (idempotent); returns what it did, for the log."""
    state = load_state()
    done = []
    kill_containers()
    if stopped := stop_processes():
        done.append(f"stopped pids {stopped}")
    remove_netns()
    unmount_under(KUBELET_ROOT, RUN)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        sh("ip", "link", "delete", BRIDGE)
        done.append(f"deleted bridge {BRIDGE}")
    for family, table in NFT_TABLES:
        if sh("nft", "delete", "table", family, table).returncode == 0:
            done.append(f"deleted nft table {family} {table}")
    if chains := remove_iptables_chains():
        done.append(f"deleted iptables chains {chains}")
    remove_cgroups()
    saved = state.get("host", {})
    if isinstance(saved, dict):
        sysctls = saved.get("sysctls", {})
        if isinstance(sysctls, dict):
            restore_sysctls({str(k): str(v) for k, v in sysctls.items()})
        if "nft_tables_before" in saved:
            # The kubelet's iptables calls create the legacy-named tables through iptables-nft; once its
            # chains are gone they are empty: delete those that were not there before.
            for table in set(nft_tables()) - set(saved["nft_tables_before"]):
                family, _, name = table.partition(" ")
                if family in ("ip", "ip6") and name in ("filter", "nat", "mangle"):
                    sh("nft", "delete", "table", family, name)
        before = {str(d) for d in saved.get("log_dirs_before", [])} if "log_dirs_before" in saved else None
        for d in LOG_DIRS:
            if before is not None and str(d) not in before:
                shutil.rmtree(d, ignore_errors=True)
    # libcni's result cache for our network (containerd 1.6 keeps it under /var/lib/cni).
    for cached in Path("/var/lib/cni/results").glob("memfit-realnode-*") if Path("/var/lib/cni/results").exists() \
            else []:
        with contextlib.suppress(OSError):
            cached.unlink()
    for d in (KUBELET_ROOT, RUN):
        shutil.rmtree(d, ignore_errors=True)
    if os.path.exists(RUN):
        done.append(f"could not remove {RUN}")
    return done

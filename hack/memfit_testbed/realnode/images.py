"""The real node's images, built here from the project's Dockerfiles (no registry is reachable).

A private dockerd (its own socket, data root under the cache, no iptables, no bridge: builds use the host
network) builds, with the legacy builder:

- the base: Debian bookworm by debootstrap, Python 3.11 in /opt/venv, the host's extra CA certificates;
- the pause image from hack/realnode/pause.c (`registry.k8s.io/pause:3.6`, what containerd asks for);
- the operator image from `Dockerfile` and the trainer image from `trainer-image/Dockerfile`, with the base
  passed as a build argument and the versions from constraints.txt (the test venv's).

Each image is tagged with the SHA-256 of its inputs (files, build arguments, base), so a warm machine
builds nothing, and docker's layer cache keeps the torch layer when only memfit's sources changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit_testbed.paths import HACK, REPO

CACHE = Path(os.environ.get("MEMFIT_REALNODE_CACHE", Path.home() / ".cache" / "memfit" / "realnode"))
DOCKER_RUN = Path("/run/memfit-docker")  # exec root: short, as dockerd's socket paths need
PAUSE_IMAGE = "registry.k8s.io/pause:3.6"
# Bump when build_base changes what it makes (the base's tag hashes this, not the module's text, so an
# unrelated edit here does not rebuild the base and, with it, the trainer's torch layer).
BASE_RECIPE = "debootstrap bookworm minbase, /opt/venv, host CAs: v1"
# python3-dev: Python.h, which every DeepSpeed op built at run time includes (the trainer image builds none
# on this base; on CPU, deepspeed.comm builds its shared-memory op at the first process group). The CUDA
# base the trainer's Dockerfile names by default carries its Python's headers.
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python3-dev", "ca-certificates")
BASE_ENV = (
    "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    # pip vendors its own CA list: point it at the system one, which has the host's extra CAs.
    "PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
)
# (role, Dockerfile, build-argument name for the base, context paths, fixed build arguments)
DOCKERFILE_IMAGES: dict[str, tuple[str, str, tuple[str, ...], dict[str, str]]] = {
    "operator": ("Dockerfile", "PYTHON_IMAGE",
                 ("Dockerfile", "pyproject.toml", "README.md", "constraints.txt", "operator",
                  "trainer-image/memfit_trainer", "hack/image/install-operator.sh"), {}),
    "trainer": ("trainer-image/Dockerfile", "BASE_IMAGE",
                ("trainer-image/Dockerfile", "pyproject.toml", "README.md", "constraints.txt", "operator/memfit",
                 "trainer-image/memfit_trainer"), {"DS_BUILD_OPS": ""}),
}
# README.md is only the package's long description (pyproject's `readme`): the context gets a stub and
# the tag ignores it, so a docs change does not rebuild the trainer image and re-import its 6 GB.
STUBS = {"README.md": "memfit (image built by the real-node tier; see docs/realnode.md)\n"}
SKIP = ("__pycache__", "*.egg-info", "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache")


class ImageError(RuntimeError):
    """An image could not be built or loaded."""


@dataclass(frozen=True, slots=True)
class Images:
    """The image references the real node runs (all present in the node's containerd once loaded)."""

    base: str
    pause: str
    operator: str
    trainer: str

    def as_dict(self) -> dict[str, str]:
        return {"base": self.base, "pause": self.pause, "operator": self.operator, "trainer": self.trainer}

    def helm_values(self) -> dict[str, dict[str, Any]]:
        """charts/memfit values naming the operator and trainer images as the node holds them (a tag per
        input hash, never `latest`, so the chart's IfNotPresent pulls nothing)."""
        op_repo, _, op_tag = self.operator.rpartition(":")
        tr_repo, _, tr_tag = self.trainer.rpartition(":")
        return {"image": {"repository": op_repo, "tag": op_tag},
                "trainer": {"image": {"repository": tr_repo, "tag": tr_tag}}}


def log(msg: str) -> None:
    print(f"[realnode images] {msg}", flush=True)


def digest_paths(root: Path, paths: Sequence[str], extra: str = "") -> str:
    """SHA-256 over the relative names and contents of every file under `paths` (sorted), plus `extra`."""
    h = hashlib.sha256(extra.encode())
    for rel in sorted(paths):
        if rel in STUBS:
            h.update(f"{rel}\0stub\0{STUBS[rel]}\0".encode())
            continue
        top = root / rel
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if any(f.match(pat) or pat in f.parts for pat in SKIP):
                continue
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def docker_bin() -> str:
    """Debian's docker CLI (20.10, the daemon's own version) when present, else the first on PATH."""
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


class Dockerd:
    """A dockerd of our own: started on enter (or a stale one of ours replaced), stopped on exit."""

    def __init__(self) -> None:
        self.sock = DOCKER_RUN / "docker.sock"
        self.pidfile = DOCKER_RUN / "dockerd.pid"
        self.root = CACHE / "docker"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.sock}", "DOCKER_BUILDKIT": "0",
                "DOCKER_CONFIG": str(CACHE / "docker-cli")}

    def docker(self, *args: str, stdin: int | None = None, capture: bool = True,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([docker_bin(), *args], env=self.env(), text=True, stdin=stdin,
                                capture_output=capture, check=False)
        if check and result.returncode != 0:
            tail = (result.stdout or "")[-3000:] + (result.stderr or "")[-3000:]
            raise ImageError(f"docker {' '.join(args[:3])} ... failed ({result.returncode}):\n{tail}")
        return result

    def has_image(self, ref: str) -> bool:
        return self.docker("image", "inspect", ref, check=False).returncode == 0

    def __enter__(self) -> Dockerd:
        self._stop_stale()
        DOCKER_RUN.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        logf = open(CACHE / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            ["dockerd", f"--data-root={self.root}", f"--exec-root={DOCKER_RUN}", f"--pidfile={self.pidfile}",
             f"--host=unix://{self.sock}", "--iptables=false", "--ip6tables=false", "--bridge=none",
             "--ip-masq=false", "--userland-proxy=false", "--storage-driver=overlay2", "--log-level=warn"],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (CACHE / "dockerd.log").read_text(errors="replace")[-2000:]
                self.__exit__()
                raise ImageError(f"dockerd did not start:\n{tail}")
            time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_pid(self.proc.pid, grace=20)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1)
            self.proc = None
        _unmount_run()

    def _stop_stale(self) -> None:
        """A dockerd left by a run that died: ours if its command line names our data root."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pidfile.read_text().strip())
            if str(self.root) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                stop_pid(pid, grace=20)
        # Its managed containerd (a child with the exec root in its arguments) may outlive it.
        for pid in pids_with_arg(str(DOCKER_RUN)):
            stop_pid(pid, grace=10)
        _unmount_run()


def _unmount_run() -> None:
    """dockerd leaves its `netns/default` bind mount under the exec root: unmount, then remove."""
    with contextlib.suppress(OSError):
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            point = line.split()[4]
            if point.startswith(str(DOCKER_RUN) + "/"):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    shutil.rmtree(DOCKER_RUN, ignore_errors=True)


def pids_with_arg(needle: str) -> list[int]:
    """PIDs whose command line contains `needle` (used only with paths that are ours)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
    return found


def stop_pid(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; reaps it if it is our child."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One image build at a time on this machine (the cache and dockerd's exec root are shared)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "images.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (deb822 or one-line sources)."""
    for f in [*sorted(Path("/etc/apt").glob("sources.list.d/*.sources")), Path("/etc/apt/sources.list")]:
        with contextlib.suppress(OSError):
            for line in f.read_text().splitlines():
                words = line.split()
                if line.startswith("URIs:") and len(words) > 1 and "security" not in words[1]:
                    return words[1]
                if line.startswith("deb ") and "security" not in line:
                    return next(w for w in words[1:] if "://" in w)
    return "http://deb.debian.org/debian"


def host_cas() -> list[Path]:
    """The host's extra CA certificates (a proxy's, on these machines): the base trusts them too."""
    return sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))


def base_tag() -> str:
    """memfit-test/base:<hash of the recipe, the packages, the environment and the host's CAs>."""
    extra = json.dumps([BASE_RECIPE, BASE_PACKAGES, BASE_ENV, [c.read_bytes().hex() for c in host_cas()]])
    return "memfit-test/base:" + hashlib.sha256(extra.encode()).hexdigest()[:16]


def build_base(d: Dockerd) -> str:
    """debootstrap bookworm minbase + Python 3.11 + /opt/venv, imported as memfit-test/base:<hash>."""
    tag = base_tag()
    if d.has_image(tag):
        return tag
    rootfs = CACHE / "tmp" / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"debootstrap bookworm into {rootfs} (about 80 s)")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", str(rootfs),
         debian_mirror()])
    for ca in host_cas():
        dst = rootfs / ca.relative_to("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ca, dst)
    run(["chroot", str(rootfs), "update-ca-certificates"])
    run(["chroot", str(rootfs), "python3", "-m", "venv", "/opt/venv"])
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
        for p in (rootfs / junk).glob("*"):
            if p.is_file():
                p.unlink()
    changes = [x for e in BASE_ENV for x in ("-c", f"ENV {e}")]
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    d.docker("import", *changes, "-", tag, stdin=tar.stdout.fileno() if tar.stdout else None)
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    log(f"built {tag} in {time.monotonic() - t0:.0f}s")
    return tag


def build_pause(d: Dockerd) -> str:
    """registry.k8s.io/pause:3.6 from hack/realnode/pause.c (static), unless the same source built it."""
    src = HACK / "realnode" / "pause.c"
    label = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    have = d.docker("image", "inspect", "-f", "{{.Comment}}", PAUSE_IMAGE, check=False)
    if have.returncode == 0 and label in have.stdout:
        return PAUSE_IMAGE
    work = CACHE / "tmp" / "pause"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run(["gcc", "-static", "-O2", "-o", str(work / "pause"), str(src)])
    with tarfile.open(work / "pause.tar", "w") as tf:
        tf.add(work / "pause", arcname="pause")
    with open(work / "pause.tar", "rb") as fh:
        d.docker("import", "-m", f"memfit pause {label}", "-c", 'ENTRYPOINT ["/pause"]', "-", PAUSE_IMAGE,
                 stdin=fh.fileno())
    shutil.rmtree(work, ignore_errors=True)
    return PAUSE_IMAGE


def build_dockerfile(d: Dockerd, role: str, base: str) -> str:
    """The role's image from the project's Dockerfile on `base`, tagged with the hash of its inputs."""
    dockerfile, base_arg, paths, fixed = DOCKERFILE_IMAGES[role]
    args = {base_arg: base, **fixed}
    tag = f"memfit/{role}:test-" + digest_paths(REPO, paths, json.dumps(args, sort_keys=True))[:16]
    if d.has_image(tag):
        return tag
    ctx = CACHE / "tmp" / f"context-{role}"
    shutil.rmtree(ctx, ignore_errors=True)
    for rel in paths:  # only the inputs that were hashed: the context is what the tag says
        src, dst = REPO / rel, ctx / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel in STUBS:
            dst.write_text(STUBS[rel])
        elif src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*SKIP))
        else:
            shutil.copy2(src, dst)
    t0 = time.monotonic()
    log(f"building {tag} from {dockerfile} on {base}")
    build_args = [x for k, v in args.items() for x in ("--build-arg", f"{k}={v}")]
    with open(CACHE / f"build-{role}.log", "w") as out:
        result = subprocess.run(
            [docker_bin(), "build", "--network=host", "-f", str(ctx / dockerfile), "-t", tag, *build_args, str(ctx)],
            env=d.env(), stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = (CACHE / f"build-{role}.log").read_text(errors="replace")[-4000:]
        raise ImageError(f"building {role} from {dockerfile} failed:\n{tail}")
    shutil.rmtree(ctx, ignore_errors=True)
    log(f"built {tag} in {time.monotonic() - t0:.0f}s")
    return tag


def run(cmd: Sequence[str]) -> None:
    result = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"{cmd[0]} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def expected_images() -> dict[str, str] | None:
    """The references the last build recorded (None before the first)."""
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((CACHE / "images.json").read_text()))
    return None


def ensure_images(roles: Sequence[str] = ("operator", "trainer"), load_into: Path | None = None) -> Images:
    """Build whatever is missing (nothing on a warm machine) and, with `load_into` (a containerd socket),
    import into its `k8s.io` namespace the images it does not have yet."""
    with cache_lock():
        missing_in_node = _missing_in_containerd(load_into) if load_into else None
        recorded = expected_images()
        if recorded and missing_in_node == [] and _recorded_is_current(recorded):
            return Images(**recorded)
        with Dockerd() as d:
            base = build_base(d)
            refs = {"base": base, "pause": build_pause(d)}
            for role in ("operator", "trainer"):
                refs[role] = build_dockerfile(d, role, base) if role in roles else recorded.get(role, "") \
                    if recorded else ""
            (CACHE / "images.json").write_text(json.dumps(refs, indent=2) + "\n")
            prune_docker(d, list(refs.values()))
            if load_into:
                prune_containerd(load_into, list(refs.values()))
                have = set(containerd_images(load_into))
                for ref in (refs["pause"], refs["operator"], refs["trainer"]):
                    if ref and normalize(ref) not in have:
                        load(d, ref, load_into)
        return Images(**refs)


def images_current() -> bool:
    """Whether the last build's images match these sources (no build needed; a node may still import
    them into its containerd, once per cache)."""
    recorded = expected_images()
    return bool(recorded) and _recorded_is_current(recorded or {})


def _recorded_is_current(recorded: dict[str, str]) -> bool:
    """Whether the recorded base and operator/trainer tags still match the sources (a cheap hash, no
    docker): a changed base recipe (its packages, say) rebuilds the base and both images on it."""
    if recorded.get("base") != base_tag():
        return False
    for role, (_, base_arg, paths, fixed) in DOCKERFILE_IMAGES.items():
        args = {base_arg: recorded["base"], **fixed}
        want = f"memfit/{role}:test-" + digest_paths(REPO, paths, json.dumps(args, sort_keys=True))[:16]
        if recorded.get(role) != want:
            return False
    return True


def _missing_in_containerd(sock: Path) -> list[str]:
    recorded = expected_images() or {}
    have = set(containerd_images(sock))
    return [r for k, r in recorded.items() if k != "base" and normalize(r) not in have] if recorded else ["?"]


def normalize(ref: str) -> str:
    """docker.io/library-style full name, as containerd stores it."""
    name = ref if "/" in ref else f"library/{ref}"
    first = name.split("/")[0]
    return name if ("." in first or ":" in first) else f"docker.io/{name}"


def containerd_images(sock: Path) -> list[str]:
    result = subprocess.run(["ctr", "-a", str(sock), "-n", "k8s.io", "images", "ls", "-q"],
                            capture_output=True, text=True, check=False)
    return result.stdout.split() if result.returncode == 0 else []


def load(d: Dockerd, ref: str, sock: Path) -> None:
    """docker save | ctr images import (unpacked for containerd's overlayfs snapshotter)."""
    t0 = time.monotonic()
    _check_free_space(d, ref, sock)
    save = subprocess.Popen([docker_bin(), "save", ref], env=d.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert save.stdout is not None
    try:
        result = subprocess.run(["ctr", "-a", str(sock), "-n", "k8s.io", "images", "import", "-"],
                                stdin=save.stdout, capture_output=True, text=True, check=False)
    finally:
        # Ours closed, ctr's end is the pipe's only reader: if ctr stopped early, `docker save` gets
        # EPIPE and exits instead of blocking on a full pipe forever.
        save.stdout.close()
    try:
        _, save_err = save.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        save.kill()
        _, save_err = save.communicate()
    if result.returncode != 0 or save.returncode != 0:
        raise ImageError(f"loading {ref} into containerd failed: ctr exit {result.returncode}: "
                         f"{result.stderr[-2000:]}; docker save exit {save.returncode}: "
                         f"{save_err.decode(errors='replace')[-1000:]}")
    log(f"loaded {ref} into containerd in {time.monotonic() - t0:.0f}s")


def _check_free_space(d: Dockerd, ref: str, sock: Path) -> None:
    """An import needs about twice the layers containerd does not hold yet on disk (the layer blobs and
    their unpacked snapshots): refuse up front, naming both figures, instead of filling the disk."""
    layers = json.loads(d.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref).stdout or "[]")
    held = set(subprocess.run(["ctr", "-a", str(sock), "-n", "k8s.io", "content", "ls", "-q"],
                              capture_output=True, text=True, check=False).stdout.split())
    sizes = _docker_layer_sizes(d)
    missing = sum(sizes.get(layer, 0) for layer in layers if layer not in held)
    CACHE.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(CACHE).free
    if free < 2 * missing + (1 << 30):
        raise ImageError(f"loading {ref} into containerd needs up to {2 * missing / 2**30:.1f} GiB free (+1 GiB "
                         f"headroom) under {CACHE}; {free / 2**30:.1f} GiB is free")


def _docker_layer_sizes(d: Dockerd) -> dict[str, int]:
    """Uncompressed size of every layer in our dockerd's layer store, by diff ID (what `docker save` and
    containerd's content store name a layer by)."""
    sizes: dict[str, int] = {}
    for entry in (d.root / "image" / "overlay2" / "layerdb" / "sha256").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            sizes[(entry / "diff").read_text().strip()] = int((entry / "size").read_text().strip())
    return sizes


def stale(refs: Sequence[str], keep: Sequence[str]) -> list[str]:
    """memfit's own test images (`memfit/…:test-…`, `memfit-test/base:…`) that `keep` does not name."""
    kept = {normalize(k) for k in keep if k}
    ours = (normalize("memfit/operator:test-"), normalize("memfit/trainer:test-"),
            normalize("memfit-test/base:"))
    return [r for r in refs if normalize(r).startswith(ours) and normalize(r) not in kept]


def prune_docker(d: Dockerd, keep: Sequence[str]) -> None:
    """Remove the tags earlier sources left (each trainer tag pins a 6 GB image) and dangling layers;
    the layers `keep` uses stay, so the next build is still cached."""
    listed = d.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    old = stale(listed, keep)
    if old:
        d.docker("rmi", *old, check=False)
        log(f"removed {len(old)} stale image tag(s) from docker")
    d.docker("image", "prune", "-f", check=False)


def prune_containerd(sock: Path, keep: Sequence[str]) -> None:
    """Remove stale memfit images from the node's containerd and wait for its GC to drop their blobs and
    snapshots (`--sync`), so an import of the new tag has the room. The CRI plugin also names every image
    it has seen by its ID (`sha256:<config digest>`); those names pin the content as much as the tags, so
    the ones whose target no kept tag shares go too."""
    listed = _containerd_targets(sock)
    old = stale(list(listed), keep)
    kept = {listed[r] for r in listed if r not in old and not r.startswith("sha256:")}
    old += [r for r, target in listed.items() if r.startswith("sha256:") and target not in kept]
    if old:
        subprocess.run(["ctr", "-a", str(sock), "-n", "k8s.io", "images", "rm", "--sync", *old],
                       capture_output=True, text=True, check=False)
        log(f"removed {len(old)} stale image name(s) from containerd")


def _containerd_targets(sock: Path) -> dict[str, str]:
    """Image name -> the digest it points at, in the node's containerd (`k8s.io` namespace)."""
    result = subprocess.run(["ctr", "-a", str(sock), "-n", "k8s.io", "images", "ls"],
                            capture_output=True, text=True, check=False)
    rows = [line.split() for line in result.stdout.splitlines()[1:]] if result.returncode == 0 else []
    return {row[0]: row[2] for row in rows if len(row) >= 3}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roles", default="operator,trainer", help="Dockerfile images to build")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    images = ensure_images(roles=tuple(r for r in args.roles.split(",") if r))
    print(json.dumps(images.as_dict(), indent=2))
    log(f"done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

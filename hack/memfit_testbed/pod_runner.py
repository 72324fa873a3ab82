"""Local pod runner, a tiny kubelet: runs scheduled pods labelled memfit.dev/run-local=true locally."""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from memfit_testbed.kwok_pools import SIMULATED_GPU_ANNOTATION
from memfit_testbed.pod_env import (
    LOCAL_IP,
    ConfigError,
    Obj,
    PortMap,
    Rewriter,
    container_env,
    expand,
    materialise_volume,
    mount_parents,
)

LABEL = "memfit.dev/run-local"
SELECTOR = f"{LABEL}=true"
# Test-bed switch (docs/testcluster.md, "Simulated pods"): a namespace annotated with a label selector
# has its matching run-local pods handed to KWOK's simulated lifecycle instead of being executed here.
SIMULATE_ANNOTATION = "testbed.memfit.dev/simulate-pods"
SIMULATE_COMPLETE_ANNOTATION = "testbed.memfit.dev/simulate-complete-after"  # a KWOK delay, e.g. "30s"
SIMULATED_ANNOTATION = "testbed.memfit.dev/simulated"  # set on each pod handed to KWOK
KWOK_COMPLETE_DELAY = "pod-complete.stage.kwok.x-k8s.io/delay"  # hack/kwok/stages.yaml
KEEP_RUNNING = "8760h"  # no completion annotation: the simulated pod stays Running until deleted
MAX_MESSAGE = 4096
TERMINAL = ("Succeeded", "Failed")
log = logging.getLogger("pod-runner")


ENV_SIMULATED_GPU = "MEMFIT_SIMULATED_GPU"  # memfit_trainer.meters.simulated (not imported: no torch here)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork: no dlopen in the child


def _die_with_parent() -> None:
    _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the runner thread that started us


def raw(call: Any, *args: Any, **kwargs: Any) -> Obj:
    """Call a kubernetes client method and return the JSON body as a dict (camelCase, as in manifests)."""
    resp = call(*args, _preload_content=False, **kwargs)
    return dict(json.loads(resp.data))


@dataclass
class Container:
    spec: Obj
    log: Path
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    message_file: Path
    proc: subprocess.Popen[bytes] | None = None
    started: str = ""
    restarts: int = 0
    result: Obj | None = None  # the terminated state once done


@dataclass
class PodRun:
    """One pod being run: its processes, folder and a stop request from the watcher."""

    pod: Obj
    dir: Path
    stop: threading.Event = field(default_factory=threading.Event)
    grace: float = 30.0
    containers: list[Container] = field(default_factory=list)
    thread: threading.Thread | None = None

    @property
    def ns_name(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"


class PodRunner:
    """Watches run-local pods, runs them, and reports their status through pods/status."""

    def __init__(self, api: client.CoreV1Api, workdir: Path, python_bin: Path | None = None) -> None:
        self.api = api
        self.workdir = workdir
        self.python_bin = python_bin or Path(sys.executable).parent
        self.ports = PortMap()
        self.runs: dict[str, PodRun] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    # --- watch loop ------------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                pods = raw(self.api.list_pod_for_all_namespaces, label_selector=SELECTOR)
                for p in pods["items"]:
                    self.on_event("ADDED", p)
                w = watch.Watch()
                for ev in w.stream(self.api.list_pod_for_all_namespaces, label_selector=SELECTOR,
                                   resource_version=pods["metadata"]["resourceVersion"], timeout_seconds=60):
                    if self.stopping.is_set() or ev["type"] == "ERROR":
                        break
                    self.on_event(ev["type"], ev["raw_object"])
            except ApiException as e:
                if e.status != 410:
                    log.warning("watch failed: %s", e)
                    time.sleep(1)
            except Exception:
                if not self.stopping.is_set():
                    log.exception("watch loop error")
                    time.sleep(1)

    def on_event(self, kind: str, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        with self.lock:
            run = self.runs.get(uid)
            if kind == "DELETED":
                if run:
                    run.grace = 0
                    run.stop.set()
                    self.runs.pop(uid, None)
                    threading.Thread(target=self._forget, args=(run,), daemon=True).start()
                return
            if not spec.get("nodeName"):
                return
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if meta.get("deletionTimestamp"):
                if run:
                    run.grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                    run.stop.set()
                elif phase not in TERMINAL:
                    self._delete_now(pod)
                return
            if run is not None or phase in TERMINAL:
                return
            if phase == "Running":  # started by a runner that is gone: its process is lost
                self._patch(pod, {"phase": "Failed", "reason": "RunnerLost",
                                  "message": "the local pod runner that ran this pod exited"})
                return
            if self._hand_to_kwok(pod):
                return
            run = PodRun(pod=pod, dir=self.workdir / meta["namespace"] / f"{meta['name']}-{uid[:8]}")
            run.thread = threading.Thread(target=self._run_pod, args=(run,), name=run.ns_name, daemon=True)
            self.runs[uid] = run
        run.thread.start()

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            run.grace = min(run.grace, 5.0)
            run.stop.set()
        for run in runs:
            for c in run.containers:
                if c.proc is not None:
                    _kill(c.proc, 5.0)

    # --- one pod ---------------------------------------------------------------------------------

    def _run_pod(self, run: PodRun) -> None:
        pod = run.pod
        try:
            if not self._prepare(run):
                return
            spec = pod["spec"]
            policy = spec.get("restartPolicy", "Always")
            deadline = spec.get("activeDeadlineSeconds")
            start, started = time.monotonic(), now()
            init = run.containers[: len(spec.get("initContainers") or [])]
            main = run.containers[len(init):]
            init_policy = "Never" if policy == "Never" else "OnFailure"
            for c in init:
                self._start(run, c)
                self._report(run, "Pending", init, main, started)
                if _sidecar(c):
                    continue  # a native sidecar: started, it runs beside what follows until the pod ends
                if not self._wait(run, [c], init_policy, start, deadline):
                    return self._finish(run, init, main, started)
                if c.result and c.result["exitCode"] != 0:
                    return self._finish(run, init, main, started)
            for c in main:
                self._start(run, c)
            self._report(run, "Running", init, main, started)
            self._wait(run, main, policy, start, deadline, lambda: self._report(run, "Running", init, main,
                                                                                 started))
            self._finish(run, init, main, started)
        except Exception as e:
            log.exception("pod %s failed in the runner", run.ns_name)
            for c in run.containers:
                if c.proc is not None:
                    _kill(c.proc, 1.0)
            self._patch(pod, {"phase": "Failed", "reason": "RunnerError", "message": str(e)[:MAX_MESSAGE]})

    def _prepare(self, run: PodRun) -> bool:
        """Materialise volumes and build every container's argv/env; retry config errors like a kubelet."""
        while True:
            try:
                run.containers = self._containers(run)
                return True
            except ConfigError as e:
                log.warning("pod %s: %s", run.ns_name, e)
                spec = run.pod["spec"]
                statuses = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                             "restartCount": 0, "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                                      "message": str(e)}}}
                            for c in spec["containers"]]
                self._patch(run.pod, {"containerStatuses": statuses})
                if run.stop.wait(2.0):
                    self._delete_now(run.pod)
                    return False

    def _containers(self, run: PodRun) -> list[Container]:
        pod, spec = run.pod, run.pod["spec"]
        meta = pod["metadata"]
        shutil.rmtree(run.dir, ignore_errors=True)
        vols: dict[str, Path] = {}
        for v in spec.get("volumes") or []:
            vols[v["name"]] = run.dir / "volumes" / v["name"]
            if claim := (v.get("persistentVolumeClaim") or {}).get("claimName"):
                # Like a real claim, its data outlives the pod: later pods (a re-plan's attempt) see it.
                vols[v["name"]] = self.workdir / "claims" / meta["namespace"] / claim
            materialise_volume(pod, v, vols[v["name"]], self._lookup, lambda sat: self._token(pod, sat))
        subdomains = [spec.get("subdomain", ""), *self._headless_services(meta["namespace"])]
        hostname = spec.get("hostname") or meta["name"]
        out = []
        for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
            msg = run.dir / "termination" / c["name"]
            msg.parent.mkdir(parents=True, exist_ok=True)
            msg.write_bytes(b"")
            paths = {c.get("terminationMessagePath", "/dev/termination-log"): str(msg)}
            for m in c.get("volumeMounts") or []:
                local = vols.get(m["name"])
                if local is None:
                    raise ConfigError(f"volumeMount {m['name']!r} names no volume")
                paths[m["mountPath"]] = str(local / m.get("subPath", "")).rstrip("/")
            paths.update(mount_parents(paths, run.dir / "root" / c["name"]))
            rw = Rewriter(meta["namespace"], paths, subdomains, self.ports)
            pod_env = container_env(pod, c, self._lookup)
            env = rw.env(pod_env)
            changed = {k: v for k, v in env.items() if pod_env.get(k) != v}
            if changed:
                log.info("pod %s container %s: env rewritten: %s", run.ns_name, c["name"], changed)
            argv = [*(c.get("command") or []), *(c.get("args") or [])]
            if not c.get("command"):
                raise ConfigError(f"container {c['name']!r} has no command: the local runner ignores images")
            argv = rw.args([expand(a, env) for a in argv], env)
            full = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
            full.update(HOSTNAME=hostname, GLOO_SOCKET_IFNAME="lo", MEMFIT_TERMINATION_MESSAGE_PATH=str(msg),
                        MEMFIT_LOCAL_MOUNTS=json.dumps(rw.paths, sort_keys=True))
            full.update(env)
            simulated = self._simulated_gpu(spec.get("nodeName", ""))
            if simulated:
                full[ENV_SIMULATED_GPU] = simulated
            full["PATH"] = f"{self.python_bin}{os.pathsep}{env.get('PATH', os.environ.get('PATH', ''))}"
            exe = shutil.which(argv[0], path=full["PATH"])
            if exe is None:
                raise ConfigError(f"container {c['name']!r}: {argv[0]!r} not found in PATH")
            wd = c.get("workingDir")
            cwd = Path(rw.text(wd)) if wd and rw.text(wd) != wd else run.dir / "workdir"
            cwd.mkdir(parents=True, exist_ok=True)
            logf = self.workdir / "logs" / f"{meta['namespace']}_{meta['name']}_{c['name']}.log"
            out.append(Container(spec=c, log=logf, argv=argv, env=full, cwd=cwd, message_file=msg))
        return out

    def _start(self, run: PodRun, c: Container) -> None:
        c.message_file.write_bytes(b"")
        with open(c.log, "ab") as f:
            c.proc = subprocess.Popen(
                c.argv, env=c.env, cwd=c.cwd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        c.started, c.result = now(), None
        log.info("pod %s container %s: pid %d: %s", run.ns_name, c.spec["name"], c.proc.pid, c.argv)

    def _wait(self, run: PodRun, cs: list[Container], policy: str, start: float, deadline: int | None,
              on_restart: Any = None) -> bool:
        """Wait for the containers, restarting them per restartPolicy; False if stopped or past deadline."""
        while True:
            if run.stop.wait(0.1) or (deadline is not None and time.monotonic() - start > deadline):
                for c in cs:
                    if c.proc is not None and c.proc.poll() is None:
                        _kill(c.proc, run.grace)
                    self._collect(run, c)
                if not run.stop.is_set():
                    run.pod.setdefault("status", {})["reason"] = "DeadlineExceeded"
                return False
            for c in cs:
                if c.result is None and c.proc is not None and c.proc.poll() is not None:
                    self._collect(run, c)
                    code = c.result["exitCode"] if c.result else 1
                    if policy == "Always" or (policy == "OnFailure" and code != 0):
                        c.restarts += 1
                        time.sleep(min(10.0, 0.5 * 2 ** min(c.restarts, 5)))
                        self._start(run, c)
                        if on_restart:
                            on_restart()
            if all(c.result is not None for c in cs):
                return True

    def _collect(self, run: PodRun, c: Container) -> None:
        if c.proc is None or c.result is not None:
            return
        rc = c.proc.wait()
        code = rc if rc >= 0 else 128 - rc
        msg = c.message_file.read_bytes()[:MAX_MESSAGE].decode(errors="replace")
        fallback = c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        if not msg.strip() and code != 0 and fallback:
            msg = "\n".join(c.log.read_bytes()[-2048:].decode(errors="replace").splitlines()[-80:])
        c.result = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "startedAt": c.started, "finishedAt": now(),
                    "containerID": f"memfit-local://{c.proc.pid}"}
        if rc < 0:
            c.result["signal"] = -rc
        if msg:
            c.result["message"] = msg
        if code != 0:
            tail = c.log.read_bytes()[-1500:].decode(errors="replace")
            log.info("pod %s container %s exited %d; log tail:\n%s", run.ns_name, c.spec["name"], code, tail)

    def _finish(self, run: PodRun, init: list[Container], main: list[Container], started: str) -> None:
        for c in run.containers:
            if _sidecar(c) and c.proc is not None and c.proc.poll() is None:
                _kill(c.proc, run.grace)  # the kubelet stops sidecars once the other containers ended
            self._collect(run, c)
        # Like the kubelet, the phase follows the containers that are not sidecars.
        ok = all(c.result is not None and c.result["exitCode"] == 0 for c in run.containers if not _sidecar(c))
        phase = "Succeeded" if ok else "Failed"
        self._report(run, phase, init, main, started)
        log.info("pod %s: %s", run.ns_name, phase)
        if run.stop.is_set():
            self._delete_now(run.pod)

    # --- status ----------------------------------------------------------------------------------

    def _report(self, run: PodRun, phase: str, init: list[Container], main: list[Container],
                started: str) -> None:
        t = now()
        running = phase == "Running"
        init_done = all(_sidecar(c) or (c.result is not None and c.result["exitCode"] == 0) for c in init)
        cond = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": started},
            {"type": "Initialized", "status": "True" if init_done else "False", "lastTransitionTime": t},
            {"type": "ContainersReady", "status": "True" if running else "False", "lastTransitionTime": t},
            {"type": "Ready", "status": "True" if running else "False", "lastTransitionTime": t},
        ]
        if phase in TERMINAL:
            for c in cond[2:]:
                c["reason"] = "PodCompleted"
        status: Obj = {"phase": phase, "startTime": started, "conditions": cond, "hostIP": LOCAL_IP,
                       "hostIPs": [{"ip": LOCAL_IP}], "podIP": LOCAL_IP, "podIPs": [{"ip": LOCAL_IP}],
                       "containerStatuses": [_cstatus(c) for c in main]}
        if init:
            status["initContainerStatuses"] = [_cstatus(c) for c in init]
        if reason := (run.pod.get("status") or {}).get("reason"):
            status.update(reason=reason, message="Pod was active on the node longer than its deadline")
        self._patch(run.pod, status)

    def _patch(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        try:
            self.api.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status},
                _content_type="application/strategic-merge-patch+json")
        except ApiException as e:
            if e.status != 404:
                log.warning("status of %s/%s: %s", meta["namespace"], meta["name"], e)

    def _delete_now(self, pod: Obj) -> None:
        meta = pod["metadata"]
        try:
            # With a body the API server ignores query parameters: the grace period goes in the body.
            body = client.V1DeleteOptions(grace_period_seconds=0,
                                          preconditions=client.V1Preconditions(uid=meta["uid"]))
            self.api.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("delete %s/%s: %s", meta["namespace"], meta["name"], e)

    def _forget(self, run: PodRun) -> None:
        if run.thread is not None:
            run.thread.join(timeout=30)
        shutil.rmtree(run.dir, ignore_errors=True)

    def _hand_to_kwok(self, pod: Obj) -> bool:
        """Test-bed switch: leave the pod to KWOK when its namespace's SIMULATE_ANNOTATION selects it.

        The pod loses the run-local label (KWOK's pod stages skip labelled pods) and gets
        SIMULATED_ANNOTATION plus KWOK's completion delay: the namespace's SIMULATE_COMPLETE_ANNOTATION,
        else KEEP_RUNNING. Nothing is executed for it. Only the test bed reads these annotations."""
        meta = pod["metadata"]
        try:
            ns = raw(self.api.read_namespace, meta["namespace"])
        except ApiException:
            return False
        ns_annotations = ns["metadata"].get("annotations") or {}
        selector = ns_annotations.get(SIMULATE_ANNOTATION)
        if not selector or not selector_matches(selector, meta.get("labels") or {}):
            return False
        delay = ns_annotations.get(SIMULATE_COMPLETE_ANNOTATION) or KEEP_RUNNING
        patch = {"metadata": {"labels": {LABEL: None},
                              "annotations": {SIMULATED_ANNOTATION: "true", KWOK_COMPLETE_DELAY: delay}}}
        try:
            self.api.patch_namespaced_pod(meta["name"], meta["namespace"], patch)
        except ApiException as e:
            if e.status != 404:
                log.warning("hand %s/%s to kwok: %s", meta["namespace"], meta["name"], e)
            return e.status == 404
        log.info("pod %s/%s left to kwok (namespace %s: %s=%r)", meta["namespace"], meta["name"],
                 meta["namespace"], SIMULATE_ANNOTATION, selector)
        return True

    # --- API lookups -----------------------------------------------------------------------------

    def _simulated_gpu(self, node: str) -> str:
        """The node's simulated GPU (kwok_pools.SIMULATED_GPU_ANNOTATION), '' for none."""
        if not node:
            return ""
        try:
            annotations = raw(self.api.read_node, node)["metadata"].get("annotations") or {}
        except ApiException:
            return ""
        return str(annotations.get(SIMULATED_GPU_ANNOTATION, ""))

    def _lookup(self, kind: str, ns: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "configmap":
                obj = raw(self.api.read_namespaced_config_map, name, ns)
                data = dict(obj.get("data") or {})
                data.update({k: base64.b64decode(v).decode(errors="replace")
                             for k, v in (obj.get("binaryData") or {}).items()})
                return data
            obj = raw(self.api.read_namespaced_secret, name, ns)
            data = obj.get("data") or {}
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _token(self, pod: Obj, sat: Obj) -> str:
        meta = pod["metadata"]
        body = {"spec": {"audiences": [sat["audience"]] if sat.get("audience") else None,
                         "expirationSeconds": int(sat.get("expirationSeconds", 3600)),
                         "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                            "uid": meta["uid"]}}}
        try:
            tr = raw(self.api.create_namespaced_service_account_token,
                     pod["spec"].get("serviceAccountName", "default"), meta["namespace"], body)
            return str(tr["status"]["token"])
        except ApiException as e:
            log.warning("token for %s/%s: %s", meta["namespace"], meta["name"], e)
            return ""

    def _headless_services(self, ns: str) -> list[str]:
        try:
            svcs = raw(self.api.list_namespaced_service, ns)["items"]
        except ApiException:
            return []
        return [s["metadata"]["name"] for s in svcs if (s.get("spec") or {}).get("clusterIP") == "None"]


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """An equality-based label selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated: all must hold)."""
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        if "!=" in term:
            key, value = (x.strip() for x in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (x.strip() for x in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def simulate_pods(
    core: client.CoreV1Api, namespace: str, selector: str, complete_after: str | None = None
) -> None:
    """Test-bed switch: the pod runner leaves the namespace's run-local pods matching `selector` to KWOK
    (Running until deleted, or completing `complete_after` after they run: a KWOK duration)."""
    annotations = {SIMULATE_ANNOTATION: selector, SIMULATE_COMPLETE_ANNOTATION: complete_after}
    core.patch_namespace(namespace, {"metadata": {"annotations": annotations}})


def _sidecar(c: Container) -> bool:
    """A native sidecar: an init container with restartPolicy Always (not restarted here when it exits)."""
    return c.spec.get("restartPolicy") == "Always"


def _cstatus(c: Container) -> Obj:
    st: Obj = {"name": c.spec["name"], "image": c.spec.get("image", ""), "imageID": "",
               "restartCount": c.restarts}
    if c.result is not None:
        st.update(ready=False, started=False, state={"terminated": c.result},
                  containerID=c.result["containerID"])
    elif c.proc is not None:
        st.update(ready=True, started=True, state={"running": {"startedAt": c.started}},
                  containerID=f"memfit-local://{c.proc.pid}")
    else:
        st.update(ready=False, started=False, state={"waiting": {"reason": "PodInitializing"}})
    return st


def _kill(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the container's processes, SIGKILL them after `grace` seconds: its process group and every
    descendant, as a kubelet ends the container's whole cgroup (a launcher such as torchrun starts its
    workers in sessions of their own, which outlived the group's SIGKILL and went on training)."""
    tree = descendants(proc.pid)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        signal_tree(proc.pid, tree, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(wait, 0.01))
    signal_tree(proc.pid, tree + descendants(proc.pid), signal.SIGKILL)  # stray grandchildren


def descendants(pid: int) -> list[int]:
    """Every process started under `pid`, however deep (none once it is gone)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pid: int, tree: list[int], sig: int) -> None:
    """Send `sig` to `pid`'s process group and to each process of `tree` and its group."""
    for target in (pid, *tree):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(target, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/memfit-pod-runner"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    api = client.CoreV1Api(config.new_client_from_config(config_file=args.kubeconfig))
    runner = PodRunner(api, args.workdir.resolve())

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        runner.shutdown()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("watching pods with %s (python %s)", SELECTOR, runner.python_bin)
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

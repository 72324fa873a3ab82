"""`make demo`: memfit end to end on this machine.

Starts the local control plane with simulated GPU pools (KWOK), installs the CRDs and GPUNodePools,
runs `memfit operator`, applies examples/quickstart.yaml, streams its phase changes until it
finishes, and prints the plan, the savings against the baseline and where the metrics are.

Where the machine supports it (root, containerd, the node binaries: the capability check is printed),
the profiler and trainer pods run as containers of the trainer image built from trainer-image/Dockerfile
on a real node (kubelet + containerd, docs/realnode.md) standing in for the `t4-spot` pool; elsewhere
they run, on CPU, as processes of the local pod runner (docs/testcluster.md). The demo prints which, and
at the end the node and container runtime each pod of the job ran on.

`--finetune` (`make demo-finetune`) runs examples/finetune-tiny.yaml instead, on claims `models` and
`corpus` holding a tiny pretrained Llama and a JSONL corpus made here (memfit_testbed.claims: on the real
node, hostPath volumes on it; with the pod runner, the provisioner's folders).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from memfit_testbed import kwok_pools, testcluster
from memfit_testbed.memfit_api import install_memfit_api
from memfit_testbed.paths import REPO


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    result = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def choose_runtime(wanted: str, images: str = "build") -> bool:
    """True for the real node: printed capability check (auto), or the forced choice. With `images`
    "ready-only", auto takes the real node only when its images are built for these sources: a cold build
    (the trainer image and its import into the node's containerd, about 13 min on 2 cores) never holds up
    the quickstart, which then runs on the local pod runner and says how to see the real node."""
    if wanted == "pod-runner":
        print("==> runtime: local pod runner (asked for)")
        return False
    from memfit_testbed.realnode import hostchanges
    from memfit_testbed.realnode.node import unsupported_reason

    reason = unsupported_reason()
    state = hostchanges.load_state()
    if reason is None and state and hostchanges.remaining():
        from memfit_testbed.realnode.node import _cluster_alive

        if _cluster_alive(state):
            reason = f"the real node is in use by the cluster in {state.get('cluster_dir')}"
    if reason is None and wanted == "auto" and images == "ready-only":
        from memfit_testbed.realnode.images import images_current

        if not images_current():
            print("==> runtime: local pod runner (the real node's images are not built for these sources yet; "
                  "`make demo-realnode` builds them, about 13 min cold, and runs this demo there)")
            return False
    if reason is None:
        print("==> runtime: real node (kubelet + containerd); capability check passed")
        return True
    if wanted == "real-node":
        raise SystemExit(f"real node not supported here: {reason}")
    print(f"==> runtime: local pod runner (real node unsupported: {reason}; `make demo-realnode` installs what "
          "it needs and runs this demo there)")
    return False


def observe_pod_runtimes(kubeconfig: Path, job: str) -> dict[str, str]:
    """Pod name -> the node and container runtime it runs on, from the pods' status (memfit deletes a
    finished attempt's pods: call it while the job runs)."""
    pods = json.loads(kubectl(kubeconfig, "get", "pods", "-l", f"memfit.dev/job={job}", "-o", "json"))["items"]
    seen = {}
    for pod in pods:
        cid = ((pod.get("status", {}).get("containerStatuses") or [{}])[0]).get("containerID", "")
        runtime = cid.split("://")[0]
        if not runtime:
            continue  # not started yet
        kind = "real kubelet, containers" if runtime == "containerd" else "local pod runner, processes"
        seen[pod["metadata"]["name"]] = f"{pod['spec'].get('nodeName')} ({runtime}: {kind})"
    return seen


def prepare_finetune_claims(kubeconfig: Path, workdir: Path, namespace: str) -> dict[str, Path]:
    """Claims `models` (a tiny pretrained Llama + tokenizer at tiny-llama/) and `corpus` (train.jsonl,
    eval.jsonl), as `hack/testcluster claims --finetune-data` makes them; claim name -> host folder."""
    from kubernetes import client, config
    from memfit_testbed.claims import FINETUNE_CLAIMS, ensure_claims, fill_finetune_claims

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    made = ensure_claims(api, workdir=workdir, namespace=namespace, names=FINETUNE_CLAIMS)
    fill_finetune_claims(made)
    print(f"==> claims models (tiny pretrained Llama) and corpus (JSONL) ready ({made[0].where}): "
          f"{', '.join(str(c.folder) for c in made)}", flush=True)
    return {c.name: c.folder for c in made}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/memfit-demo"), help="cluster folder")
    ap.add_argument("--job", type=Path, default=REPO / "examples" / "quickstart.yaml", help="MOTJ to apply")
    ap.add_argument("--timeout", type=float, default=900, help="seconds to wait for the job")
    ap.add_argument("--keep", action="store_true", help="leave the cluster and operator running")
    ap.add_argument("--runtime", choices=["auto", "real-node", "pod-runner"], default="auto",
                    help="where the pods run: a real node when supported (auto), or force one")
    ap.add_argument("--finetune", action="store_true",
                    help="the fine-tune demo: examples/finetune-tiny.yaml on claims `models` and `corpus` holding "
                         "a tiny pretrained Llama and a JSONL corpus made here")
    ap.add_argument("--images", choices=["ready-only", "build"], default="ready-only",
                    help="auto runtime: take the real node only when its images are built (ready-only), or "
                         "build them first (build)")
    args = ap.parse_args(argv)
    if args.finetune:
        args.job = REPO / "examples" / "finetune-tiny.yaml"

    real = choose_runtime(args.runtime, args.images)
    cluster = testcluster.TestCluster(workdir=args.dir.resolve(), pod_runner=not real)
    if cluster.running():
        testcluster.stop_real_node(cluster.workdir)
        cluster.stop()
    started = time.monotonic()
    print(f"==> starting the local cluster in {args.dir} ...", flush=True)
    cluster.start()
    kube = cluster.kubeconfig
    operator = None
    node = None
    metrics_port = 18080
    try:
        nodes = kwok_pools.apply_pools(str(kube))
        print(f"==> cluster up in {time.monotonic() - started:.0f}s with {len(nodes)} simulated nodes", flush=True)
        operator_args = ["--extra-pod-label", "memfit.dev/run-local=true"]
        if real:
            from memfit_testbed.realnode.node import RealNode

            print("==> starting the real node (images are built on first use: minutes cold, cached after)",
                  flush=True)
            node = RealNode(cluster_dir=cluster.workdir, apiserver_port=cluster.ports["apiserver"])
            secs = node.start()
            assert node.images is not None
            print(f"==> real node {node.node_name} Ready in {secs:.0f}s for pool {node.pool}; trainer image "
                  f"{node.images.trainer}", flush=True)
            operator_args = ["--trainer-image", node.images.trainer]
        install_memfit_api(kube)  # crds/ and hack/kwok/gpunodepools.yaml, as `hack/testcluster up` does
        log_path = args.dir / "operator.log"
        print(f"==> starting memfit operator (log: {log_path}, metrics: http://127.0.0.1:{metrics_port}/metrics)")
        env = {**os.environ, "KUBECONFIG": str(kube)}
        operator = subprocess.Popen(
            [sys.executable, "-m", "memfit.cli", "operator", "--metrics-host", "127.0.0.1",
             "--metrics-port", str(metrics_port), *operator_args, "--resync-seconds", "2"],
            env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )
        time.sleep(3)
        print(kubectl(kube, "get", "gpunodepools"))
        doc_name = json.loads(kubectl(kube, "create", "--dry-run=client", "-o", "json", "-f", str(args.job)))
        name = doc_name["metadata"]["name"]
        claim_folders: dict[str, Path] = {}
        if args.finetune:
            claim_folders = prepare_finetune_claims(kube, cluster.workdir,
                                                    doc_name["metadata"].get("namespace") or "default")
        kubectl(kube, "apply", "-f", str(args.job))
        print(f"==> applied {args.job.name}; phases:", flush=True)
        last = ""
        deadline = time.monotonic() + args.timeout
        job: dict = {}
        ran_on: dict[str, str] = {}
        while time.monotonic() < deadline:
            ran_on.update(observe_pod_runtimes(kube, name))
            job = json.loads(kubectl(kube, "get", "motj", name, "-o", "json"))
            status = job.get("status") or {}
            line = f"{status.get('phase', 'Pending')}: {status.get('message', '')}"
            if line != last:
                print(f"  [{time.monotonic() - started:5.0f}s] {line}", flush=True)
                last = line
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            if operator.poll() is not None:
                print(f"operator exited:\n{log_path.read_text()[-3000:]}")
                return 1
            time.sleep(1)
        print(kubectl(kube, "get", "motj", name, "-o", "wide"))
        status = job.get("status") or {}
        plan = status.get("plan") or {}
        if plan:
            print(f"==> plan: {plan.get('gpus')}x{plan.get('gpuProduct')} on {plan.get('nodePool')}, "
                  f"{plan.get('engine')} ZeRO-{plan.get('zeroStage')} {plan.get('precision')}, micro-batch "
                  f"{plan.get('microBatchSize')}x{plan.get('gradientAccumulationSteps')}, predicted peak "
                  f"{plan.get('predictedPeak')}, {plan.get('costPerHourText')}/h")
            if plan.get("baselineCostPerHour") is not None:
                print(f"==> baseline ${plan['baselineCostPerHour']:.2f}/h -> savings {plan.get('savings')}")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            lines = [x for x in resp.read().decode().splitlines() if x.startswith("memfit_job")]
        print("==> metrics (memfit_job_*):\n  " + "\n  ".join(lines[:12]))
        ran_on.update(observe_pod_runtimes(kube, name))
        print("==> the pods ran on: " + (", ".join(sorted(set(ran_on.values()))) or "no pods seen running"))
        for pod, where in sorted(ran_on.items()):
            print(f"  {pod}: {where}")
        ok = status.get("phase") == "Succeeded"
        if args.finetune and ok:
            output = doc_name["spec"]["output"]
            saved = claim_folders[output["volumeClaim"]] / output["path"]
            summary = json.loads((saved / "memfit_training.json").read_text())
            print(f"==> eval loss: {summary['initial_eval_loss']:.3f} -> {summary['final_eval_loss']:.3f}")
            print(f"==> saved: {saved} (claim {output['volumeClaim']}, path {output['path']})")
            if real and not args.keep:  # the node's folders go with it at the end: keep a copy
                kept = args.dir.resolve() / "finetuned" / output["path"]
                shutil.copytree(saved, kept, dirs_exist_ok=True)
                print(f"==> copied to {kept} (the real node's volumes are removed when it stops)")
        where = f"on the real node {node.node_name} (containers)" if node else "with the local pod runner (processes)"
        print(f"==> {name} {status.get('phase')} in {time.monotonic() - started:.0f}s, {where}")
        if args.keep:
            print(f"cluster and operator keep running: export KUBECONFIG={kube}; stop with "
                  f"`hack/testcluster down --dir {args.dir}` and `kill {operator.pid}`")
            operator = None
            return 0 if ok else 1
        return 0 if ok else 1
    finally:
        if operator is not None:
            operator.terminate()
            try:
                operator.wait(timeout=15)
            except subprocess.TimeoutExpired:
                operator.kill()
        if not args.keep:
            if node is not None:
                node.stop()
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: 1,000 MOTJs with cached profiles against 200 KWOK GPU nodes in 4 pools (issue 8 §5).

Starts a local control plane (no pod runner: KWOK completes the Job-owned pods), creates 4 GPU pools of
50 nodes each with their GPUNodePools, seeds the profile cache, starts `memfit operator` as a process
(scoped to the scenario's namespace) and creates the MOTJs in two scenarios, each with a fresh operator
process: `paced` (10 jobs/s, so 1,000 jobs arrive over 100 s; three runs in a row by default, each
namespace deleted before the next) and `burst` (all at once from 8 client threads). For each it records:

- the time until every training Job exists (from the first create call);
- per job, create -> launched: from the create call returning to the training Job `<job>-train-0`
  appearing in a watch (p50, p90, p99, max);
- the time until every job is Succeeded;
- the operator's peak RSS (VmHWM) and CPU seconds (utime + stime) from /proc.

Targets: all launched <= 120 s, p99 <= 10 s and operator CPU <= 40 s in every paced run, RSS <= 300 MB, burst launch rate >= 0.5 of a bare client
writing the same objects in the same run (benchmarks/bare_client.py) (a burst of 1,000 has p99 ~ the time
to launch them all, so the p99 target is read on the paced arrival). Prints a table, writes
benchmarks/results/scale.json (`--quick`: 100 jobs on 40 nodes, benchmarks/results/scale-quick.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from api_requests import per_job, request_counts
from bare_client import memfit_writes, replay
from kubernetes import client, config
from memfit_testbed import kwok_pools, testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability import chaos
from memfit_testbed.reliability.invariants import JobRecorder
from provenance import stamp

REPO = Path(__file__).resolve().parent.parent
# The sources this benchmark measures (a change to any of them makes its result stale).
# The test bed's part is what scale imports and the processes its cluster starts (the provisioner), not
# all of hack/memfit_testbed: a change to the fault kit or the pod runner does not move these numbers.
TESTBED = "hack/memfit_testbed/"
MEASURES = ["operator/memfit", "hack/kwok", "benchmarks/scale.py", "benchmarks/bare_client.py", "benchmarks/api_requests.py",
            *(TESTBED + f for f in ("__init__.py", "cluster_helpers.py", "kwok_pools.py", "operator_helpers.py",
                                    "paths.py", "profiles.py", "provisioner.py", "testcluster.py",
                                    "reliability/__init__.py", "reliability/chaos.py", "reliability/chaos_stages.py",
                                    "reliability/invariants.py"))]

TARGETS = {
    "all_launched_seconds": 120.0,
    "p99_create_to_launched_seconds": 10.0,
    "operator_peak_rss_mb": 300.0,
    "operator_cpu_seconds_paced": 40.0,  # the whole paced run: 1,000 jobs from first create to all finished
    # memfit's burst launch rate (jobs/s to every training Job) over a bare client's writing the same
    # objects (benchmarks/bare_client.py), same cluster, same run.
    "burst_launch_rate_vs_bare_client": 0.5,
}
A10G = kwok_pools.Pool(
    name="a10g-ondemand",
    nodes=1,
    instance_type="g5.xlarge",
    capacity_type="on-demand",
    cpu="4",
    memory="16Gi",
    zone="us-east-1a",
    gpu=kwok_pools.Gpu(
        product="NVIDIA-A10G", memory_mib=23028, count=1, family="ampere", compute_major=8, compute_minor=6
    ),
)
A10G_POOL = {
    "apiVersion": "memfit.dev/v1alpha1",
    "kind": "GPUNodePool",
    "metadata": {"name": "a10g-ondemand"},
    "spec": {
        "gpu": {"product": "NVIDIA-A10G", "memoryMiB": 23028, "perNode": 1},
        "nodeSelector": {"memfit.dev/pool": "a10g-ondemand"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "pricePerNodeHour": 1.006,
        "capacityType": "on-demand",
        "maxNodes": 1,
    },
}
POOLS = ("t4-spot", "l4-ondemand", "a10g-ondemand", "a100-80-ondemand")


def delete_namespace(kube: Kube, namespace: str, timeout: float = 600.0) -> None:
    """Delete a scenario's namespace (its jobs and their children) and wait until it is gone, and until
    the test bed's provisioner has deleted the volumes its claims left: a run that started while 1,000
    released volumes were still being deleted saw its own claims bound a minute late, its pods unschedulable
    meanwhile, and memfit re-planned them (NoCapacity after the quickstart's 60 s)."""
    kube.core.delete_namespace(namespace)
    kube.wait(f"namespace {namespace} deleted",
              lambda: kube.raw(kube.core.read_namespace, namespace) is None, timeout=timeout, interval=1.0)

    def volumes_left() -> int:
        items = (kube.raw(kube.core.list_persistent_volume) or {}).get("items") or []
        return sum(1 for v in items if ((v.get("spec") or {}).get("claimRef") or {}).get("namespace") == namespace)

    kube.wait(f"the volumes of namespace {namespace} deleted", lambda: volumes_left() == 0 or None,
              timeout=timeout, interval=1.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def build_pools(kube: Kube, nodes_per_pool: int) -> int:
    """The 4 KWOK GPU pools at `nodes_per_pool` nodes each and their GPUNodePools; returns the node count."""
    declared = kwok_pools.load_pools()
    pools = [dataclasses.replace(declared[n], nodes=nodes_per_pool) for n in POOLS if n in declared]
    pools.append(dataclasses.replace(A10G, nodes=nodes_per_pool))
    names: list[str] = []
    for pool in pools:
        names += kwok_pools.scale_pool(kube.core, pool, nodes_per_pool, wait=0)
    kwok_pools.wait_nodes_ready(kube.core, names, timeout=300)
    docs = [d for d in chaos.default_gpunodepools() if d["metadata"]["name"] in POOLS] + [A10G_POOL]
    for doc in docs:
        doc["spec"]["maxNodes"] = nodes_per_pool
    chaos.apply_gpunodepools(kube, docs)
    return len(names)


def create_all(kube: Kube, namespace: str, jobs: int, threads: int, rate: float = 0.0) -> dict[str, float]:
    """Create `jobs` MOTJs from `threads` threads, all at once (rate 0) or job i at i / rate seconds;
    name -> monotonic time the create call returned."""
    custom = client.CustomObjectsApi(kube.api_client)
    created: dict[str, float] = {}
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(i: int) -> None:
        if rate > 0:
            time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        name = f"scale-{i:04d}"
        custom.create_namespaced_custom_object(
            chaos.GROUP, chaos.VERSION, namespace, chaos.MOTJ, chaos.quickstart(name)
        )
        with lock:
            created[name] = time.monotonic()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(jobs)))
    return created


def phases(kube: Kube, namespace: str) -> dict[str, str]:
    custom = client.CustomObjectsApi(kube.api_client)
    raw = Kube.raw(custom.list_namespaced_custom_object, chaos.GROUP, chaos.VERSION, namespace, chaos.MOTJ)
    return {
        i["metadata"]["name"]: (i.get("status") or {}).get("phase", "") for i in (raw or {}).get("items", [])
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One cluster and its pools; each scenario in its own namespace with its own operator process."""
    work = Path(tempfile.mkdtemp(prefix="memfit-scale-"))
    cluster = testcluster.TestCluster(workdir=work, pod_runner=False, die_with_parent=True)
    cluster.start()
    try:
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        api_client.configuration.connection_pool_maxsize = 16
        kube = Kube(api_client=api_client, logs=lambda: cluster.log_tail(20))
        chaos.install_crds(cluster.kubeconfig)
        nodes = build_pools(kube, args.nodes // len(POOLS))
        scenarios = {}
        for scenario in args.scenarios:
            rate = args.rate if scenario.startswith("paced") else 0.0
            scenarios[scenario] = run_scenario(kube, cluster, work, scenario, rate=rate, args=args)
            if scenario.startswith("paced"):  # the next run starts on the same cluster state as this one
                delete_namespace(kube, f"scale-{scenario}")
        bare = None
        if "burst" in scenarios:
            bare = replay(kube, memfit_writes(kube, "scale-burst"), "scale-bare-client", args.threads)
            burst = scenarios["burst"]
            launched_seconds = burst["all_launched_seconds"]
            memfit_rate = burst["launched"] / launched_seconds if launched_seconds else 0.0
            bare["memfit_burst_jobs_per_second"] = round(memfit_rate, 1)
            bare["memfit_vs_bare_client"] = round(memfit_rate / bare["jobs_per_second"], 3) \
                if bare["jobs_per_second"] else None
        return {
            "benchmark": "scale: MOTJs with cached profiles against KWOK GPU nodes",
            "machine": f"{os.cpu_count()} cores shared with other engineers (load average "
            f"{os.getloadavg()[0]:.1f} at the end); {platform.python_implementation()} "
            f"{platform.python_version()}; control plane, KWOK and operator on the same cores",
            "command": "python benchmarks/scale.py" + (" --quick" if args.quick else ""),
            "jobs": args.jobs,
            "nodes": nodes,
            "pools": len(POOLS),
            "resync_seconds": args.resync,
            "targets": TARGETS,
            "scenarios": scenarios,
            "bare_client": bare,
        }
    finally:
        cluster.stop()


def run_scenario(
    kube: Kube,
    cluster: testcluster.TestCluster,
    work: Path,
    scenario: str,
    *,
    rate: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Create the jobs (paced at `rate` per second, or all at once) and measure until all finished."""
    namespace = f"scale-{scenario}"
    kube.core.create_namespace({"metadata": {"name": namespace}})
    kube.wait(
        "default ServiceAccount",
        lambda: kube.raw(kube.core.read_namespaced_service_account, "default", namespace),
        timeout=60,
    )
    seed_profile(chaos.KubeApi.from_client(kube.api_client), namespace, chaos.quickstart("seed"))
    op = chaos.OperatorProcess(
        cluster.kubeconfig,
        work / f"operator-{scenario}.log",
        namespaces=(namespace,),
        resync_seconds=args.resync,
    )
    reference = reference_cpu_seconds()
    op.start()
    op.wait_healthy()
    time.sleep(2.0)  # the operator has listed (nothing) and watches
    cpu_before = op.cpu_seconds()
    requests_before = request_counts(kube.api_client)
    recorder = JobRecorder(kube, namespace).start()
    t0 = time.monotonic()
    created = create_all(kube, namespace, args.jobs, args.threads, rate)
    create_seconds = time.monotonic() - t0
    trains = {f"{name}-train-0": name for name in created}
    deadline = t0 + args.timeout
    launched_all = None
    requests_launched = None
    while time.monotonic() < deadline:
        seen = recorder.first_seen
        if all(t in seen for t in trains):
            launched_all = max(seen[t] for t in trains) - t0
            requests_launched = per_job(requests_before, request_counts(kube.api_client), len(created), top=16)
            break
        time.sleep(0.2)
    done_all = None
    while time.monotonic() < deadline:
        ph = phases(kube, namespace)
        if len(ph) == len(created) and all(p in ("Succeeded", "Failed") for p in ph.values()):
            done_all = time.monotonic() - t0
            break
        time.sleep(1.0)
    final = phases(kube, namespace)
    cpu = op.cpu_seconds() - cpu_before
    requests = per_job(requests_before, request_counts(kube.api_client), len(created))
    rss = op.peak_rss_bytes()
    time.sleep(args.settle_seconds)  # the Job controller and GC finish their share first
    idle_cpu = _idle_cpu(op, args.idle_seconds)
    op.check_crash()
    alive = op.alive()
    op.stop()
    recorder.stop()
    seen = recorder.first_seen
    latencies = [seen[t] - created[n] for t, n in trains.items() if t in seen]
    counts: dict[str, int] = {}
    for p in final.values():
        counts[p or "none"] = counts.get(p or "none", 0) + 1
    return {
        "arrival": f"{rate:g} jobs/s" if rate > 0 else "all at once (8 client threads)",
        "create_calls_seconds": round(create_seconds, 1),
        "launched": len(latencies),
        "all_launched_seconds": round(launched_all, 1) if launched_all is not None else None,
        "create_to_launched_seconds": {
            "p50": round(statistics.median(latencies), 2) if latencies else None,
            "p90": round(percentile(latencies, 90), 2) if latencies else None,
            "p99": round(percentile(latencies, 99), 2) if latencies else None,
            "max": round(max(latencies), 2) if latencies else None,
        },
        "all_terminal_seconds": round(done_all, 1) if done_all is not None else None,
        "phases": counts,
        "duplicate_training_jobs": sum(n - 1 for n in recorder.duplicates().values()),
        "operator_peak_rss_mb": round(rss / 1e6, 1),
        "operator_cpu_seconds": round(cpu, 1),
        "reference_workload_cpu_seconds": round(reference, 2),
        "operator_idle_cpu_percent_all_finished": round(idle_cpu, 1),
        "operator_alive_at_end": alive,
        "operator_crashes": len(op.crashes),
        "operator_logged_errors": op.tracebacks(),
        # Every client's requests from the first create to all finished (the operator, the Job
        # controller, the scheduler, KWOK; watches excluded), per job.
        "api_requests": requests,
        # The same, from the first create to the last training Job seen: the launch phase alone.
        "api_requests_to_all_launched": requests_launched,
    }


def reference_cpu_seconds() -> float:
    """CPU seconds this process spends on a fixed piece of the operator's kind of work (decoding and
    walking JSON pod lists, in CPython), measured just before each scenario while its cluster is idle.
    The machine's neighbours change how fast its cores run, within a day as much as from one day to the
    next: the same operator used 65-73 s in paced runs of one morning and 34.4 s an hour later. Read the
    operator's CPU against this figure of the same run, not against another run's."""
    pod = {"metadata": {"name": "scale-0000-train-0-0-abcde", "labels": {f"memfit.dev/k{i}": "v" * 12 for i in range(8)},
                        "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {f"f:{k}": {} for k in "abcdefgh"}}] * 4},
           "spec": {"containers": [{"name": "trainer", "env": [{"name": f"MEMFIT_{i}", "value": "x" * 20} for i in range(25)]}]},
           "status": {"phase": "Running", "conditions": [{"type": t, "status": "True"} for t in "ABCDE"]}}
    document = json.dumps({"items": [pod] * 4})
    before = time.process_time()
    for _ in range(16000):
        items = json.loads(document)["items"]
        sum(len(p["spec"]["containers"][0]["env"]) for p in items if p["status"]["phase"] == "Running")
    return time.process_time() - before


def _idle_cpu(op: chaos.OperatorProcess, seconds: float) -> float:
    """Operator CPU % over `seconds` once every job has finished (the cost of resync alone)."""
    if seconds <= 0 or not op.alive():
        return 0.0
    before = op.cpu_seconds()
    time.sleep(seconds)
    return 100.0 * (op.cpu_seconds() - before) / seconds


def table(result: dict[str, Any]) -> str:
    names = list(result["scenarios"])
    rows: list[tuple[str, list[str], str]] = []

    def row(label: str, fn: Any, target: str = "") -> None:
        rows.append((label, [fn(result["scenarios"][n]) for n in names], target))

    row("arrival", lambda r: r["arrival"])
    row("all training Jobs exist after", lambda r: _s(r["all_launched_seconds"]), "<= 120 s")
    for q in ("p50", "p90", "p99", "max"):
        row(
            f"create -> launched {q}",
            lambda r, q=q: _s(r["create_to_launched_seconds"][q]),
            "<= 10 s (paced)" if q == "p99" else "",
        )
    row("all jobs finished after", lambda r: _s(r["all_terminal_seconds"]))
    row("operator peak RSS", lambda r: f"{r['operator_peak_rss_mb']} MB", "<= 300 MB")
    row("operator CPU", lambda r: f"{r['operator_cpu_seconds']} s", "<= 40 s (paced)")
    row("operator CPU idle (all finished)", lambda r: f"{r['operator_idle_cpu_percent_all_finished']} %")
    row("reference workload CPU (machine speed)", lambda r: f"{r.get('reference_workload_cpu_seconds', '-')} s")
    row(
        "operator logged errors / crashes",
        lambda r: f"{r['operator_logged_errors']} / {r['operator_crashes']}",
    )
    row("duplicate training Jobs", lambda r: str(r["duplicate_training_jobs"]), "0")
    row("phases", lambda r: " ".join(f"{k}={v}" for k, v in r["phases"].items()))
    row("API requests per job (all clients)", lambda r: str(r["api_requests"]["total_per_job"]))
    width = max(len(r[0]) for r in rows)
    head = f"{result['jobs']} MOTJs, {result['nodes']} KWOK GPU nodes in {result['pools']} pools"
    lines = [head, f"{'figure':<{width}}  " + "  ".join(f"{n:>30}" for n in names) + "  target"]
    lines.append("-" * len(lines[-1]))
    lines += [f"{a:<{width}}  " + "  ".join(f"{v:>30}" for v in b) + f"  {c}" for a, b, c in rows]
    bare = result.get("bare_client")
    if bare is not None:
        lines.append(f"bare client, same objects ({bare['objects']} for {bare['jobs']} jobs, {bare['threads']} threads): "
                     f"{bare['seconds']:.2f} s = {bare['jobs_per_second']} jobs/s; memfit's burst "
                     f"{bare['memfit_burst_jobs_per_second']} jobs/s = {bare['memfit_vs_bare_client']} of it "
                     f"(target >= {TARGETS['burst_launch_rate_vs_bare_client']})")
    for name in names:
        largest = result["scenarios"][name]["api_requests"]["largest_per_job"]
        lines.append(f"{name}: requests per job: " + ", ".join(f"{k} {v}" for k, v in largest.items()))
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.2f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 jobs on 40 nodes")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=None, help="KWOK GPU nodes, split over the 4 pools")
    ap.add_argument("--scenario", choices=["paced", "burst", "both"], default="both")
    ap.add_argument("--rate", type=float, default=10.0, help="arrivals per second in the paced scenario")
    ap.add_argument("--paced-runs", type=int, default=3,
                    help="paced runs in a row, each with a fresh namespace and operator (the p99 and CPU "
                         "targets hold in every one)")
    ap.add_argument("--threads", type=int, default=8, help="client threads creating MOTJs")
    ap.add_argument("--resync", type=float, default=5.0, help="operator --resync-seconds (its default)")
    ap.add_argument("--idle-seconds", type=float, default=20.0, help="measure idle operator CPU this long")
    ap.add_argument("--settle-seconds", type=float, default=30.0, help="wait before measuring idle CPU")
    ap.add_argument("--timeout", type=float, default=900.0, help="per scenario")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.jobs = args.jobs or (100 if args.quick else 1000)
    args.nodes = args.nodes or (40 if args.quick else 200)
    paced = ["paced"] + [f"paced-{i}" for i in range(2, args.paced_runs + 1)]
    args.scenarios = {"both": [*paced, "burst"], "paced": paced, "burst": ["burst"]}[args.scenario]
    out = args.json or REPO / "benchmarks" / "results" / ("scale-quick.json" if args.quick else "scale.json")
    result = run(args)
    for name, scenario in result["scenarios"].items():
        scenario["targets_met"] = targets_met(name, scenario)
    bare = result.get("bare_client")
    if bare is not None:
        ratio = bare["memfit_vs_bare_client"]
        bare["target_met"] = ratio is not None and ratio >= TARGETS["burst_launch_rate_vs_bare_client"]
    print(table(result))
    out.parent.mkdir(parents=True, exist_ok=True)
    result["provenance"] = stamp(MEASURES)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    met = all(all(r["targets_met"].values()) for r in result["scenarios"].values())
    return 0 if met and (bare is None or bare["target_met"]) else 1


def targets_met(name: str, r: dict[str, Any]) -> dict[str, bool]:
    """Each target of issue 8 §5 for one scenario. The p99 target is read on the paced arrival only:
    in a burst every job arrives at t=0, so its p99 is the time to launch nearly all of them (the
    throughput figure, bounded by `all_launched_seconds`), not a per-job latency."""
    launched = r["all_launched_seconds"]
    p99 = r["create_to_launched_seconds"]["p99"]
    met = {
        "all_launched_seconds": launched is not None and launched <= TARGETS["all_launched_seconds"],
        "operator_peak_rss_mb": r["operator_peak_rss_mb"] <= TARGETS["operator_peak_rss_mb"],
    }
    if name.startswith("paced"):
        met["p99_create_to_launched_seconds"] = p99 is not None and p99 <= TARGETS["p99_create_to_launched_seconds"]
        met["operator_cpu_seconds"] = r["operator_cpu_seconds"] <= TARGETS["operator_cpu_seconds_paced"]
    return met

if __name__ == "__main__":
    sys.exit(main())

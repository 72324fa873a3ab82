"""Benchmark: create -> training Job created, with a cached profile (issue 6 target: p50 <= 2 s).

Starts the local control plane with KWOK GPU pools, runs `memfit operator` as a process, seeds the
profile cache of the quickstart problem (as an earlier run would have left it), then creates MOTJs one
after another and measures, for each, the time from the create call returning to the training Job
existing in the API server (polled every 10 ms). Pods are simulated by KWOK (no pod runner), so this
measures the operator, not training. Prints a table and writes JSON (default
benchmarks/results/operator_latency.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from memfit.controller.kubeapi import KubeApi
from memfit_testbed import kwok_pools, testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import apply_pools, create_job, operator_process, quickstart
from memfit_testbed.profiles import seed_profile
from provenance import stamp

REPO = Path(__file__).resolve().parent.parent
# The sources this benchmark measures (a change to any of them makes its result stale).
MEASURES = [
    "operator/memfit", "hack/kwok", "benchmarks/operator_latency.py",
    *(f"hack/memfit_testbed/{name}.py" for name in (
        "__init__", "paths", "testcluster", "kwok_pools", "pod_runner", "pod_env", "cluster_helpers", "operator_helpers",
    )),
]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=30, help="MOTJs to create, one after another")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "operator_latency.json")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="memfit-latency-"))
    cluster = testcluster.TestCluster(workdir=work, pod_runner=False, die_with_parent=True)
    cluster.start()
    try:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        kwok_pools.apply_pools(str(cluster.kubeconfig))
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        kube = Kube(api_client=api_client, logs=lambda: cluster.log_tail(20))
        os.system(
            f"KUBECONFIG={cluster.kubeconfig} kubectl apply --server-side -f {REPO / 'crds'} >/dev/null"
        )
        os.system(
            f"KUBECONFIG={cluster.kubeconfig} kubectl wait --for=condition=Established crd --all >/dev/null"
        )
        apply_pools(kube)
        # Room for every job on the cheapest pool, so this measures the operator, not a capacity wait.
        pools = kwok_pools.load_pools()
        kwok_pools.scale_pool(kube.core, pools["t4-spot"], args.jobs + 2)
        client.CustomObjectsApi(api_client).patch_cluster_custom_object(
            "memfit.dev", "v1alpha1", "gpunodepools", "t4-spot", {"spec": {"maxNodes": args.jobs + 2}}
        )
        namespace = "bench"
        kube.core.create_namespace({"metadata": {"name": namespace}})
        doc = quickstart("seed")
        seed_profile(KubeApi.from_client(api_client), namespace, doc)
        batch = client.BatchV1Api(api_client)
        latencies: list[float] = []
        with operator_process(cluster.kubeconfig, work / "operator.log") as (_, _port):
            time.sleep(3)  # operator started and listed
            for i in range(args.jobs):
                name = f"lat-{i}"
                create_job(kube, namespace, quickstart(name))
                started = time.monotonic()
                while True:
                    jobs = batch.list_namespaced_job(namespace, label_selector=f"memfit.dev/job={name}").items
                    if any(j.metadata.name == f"{name}-train-0" for j in jobs):
                        break
                    if time.monotonic() - started > 60:
                        raise SystemExit(f"{name}: no training Job after 60 s; see {work / 'operator.log'}")
                    time.sleep(0.01)
                latencies.append(time.monotonic() - started)
    finally:
        cluster.stop()
    result = {
        "benchmark": "operator create -> training Job created (cached profile)",
        "machine": "CPU only, 2 cores (shared); pods simulated by KWOK",
        "jobs": len(latencies),
        "latency_seconds": {
            "p50": round(statistics.median(latencies), 3),
            "p90": round(percentile(latencies, 90), 3),
            "p99": round(percentile(latencies, 99), 3),
            "max": round(max(latencies), 3),
        },
        "target_p50_seconds": 2.0,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result["provenance"] = stamp(MEASURES)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'jobs':>6} {'p50 s':>8} {'p90 s':>8} {'p99 s':>8} {'max s':>8}")
    lat = result["latency_seconds"]
    print(f"{len(latencies):>6} {lat['p50']:>8.3f} {lat['p90']:>8.3f} {lat['p99']:>8.3f} {lat['max']:>8.3f}")
    print(f"wrote {args.json}")
    return 0 if lat["p50"] <= 2.0 else 1


if __name__ == "__main__":
    _ = yaml
    sys.exit(main())

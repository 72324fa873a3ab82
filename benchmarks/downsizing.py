"""Auto-downsizing benchmark on the local cluster: where repeated runs of one problem land, and why.

    python benchmarks/downsizing.py [--json OUT]

Starts the local control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK) with the pod
runner, runs `memfit operator` as a process, and submits the scenarios of `memfit_testbed.downsizing`:

- `down`: one problem three times on two pools of one simulated GPU product (800 MiB at $0.30/h,
  4 GiB at $0.90/h); the simulated GPU's allocator gap and context are smaller than memfit's defaults.
- `up`: one problem (every strategy field pinned) twice; the simulated GPU's gap and context are larger.

Every run really trains on CPU (the tensor bytes are the CPU allocator's, per rank); only the GPU's own
terms (reservation = allocated x fragmentation, NVML = reservation + context) are simulated, because
no GPU exists here. For each run it records the pool and $/h, the predicted peak (with the device
terms learned so far) against the measured allocator, reserved and device peaks, and the predicted
step time (for the simulated GPU, at an assumed 100 bf16 TFLOPS) beside the measured CPU step time,
which are not comparable and are reported, not fitted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import config
from memfit.controller.kubeapi import KubeApi
from memfit_testbed import downsizing as d
from memfit_testbed import testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import operator_process
from memfit_testbed.profiles import seed_profile
from provenance import stamp

REPO = Path(__file__).resolve().parent.parent
MEASURES = [
    "operator/memfit", "trainer-image/memfit_trainer", "benchmarks/downsizing.py",
    *(f"hack/memfit_testbed/{name}.py" for name in (
        "__init__", "paths", "testcluster", "kwok_pools", "pod_runner", "pod_env", "cluster_helpers",
        "operator_helpers", "profiles", "downsizing",
    )),
]  # fmt: skip
TIMEOUT = 300.0


def run_scenarios(kube: Kube, api: KubeApi, namespace: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for scenario, count in ((d.DOWN, 3), (d.UP, 2)):
        d.install(kube, scenario)
        records = d.submit_runs(kube, namespace, scenario, runs=count, timeout=TIMEOUT,
                                seed=lambda doc: seed_profile(api, namespace, doc))
        out[scenario.name] = d.as_dicts(records)
    return out


def print_table(results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"{'run':<12} {'phase':<10} {'pool':<11} {'$/h':>5} {'usable':>7} {'pred':>7} {'alloc':>7} "
          f"{'reserved':>8} {'device':>7} {'pred step s':>11} {'CPU step s':>10}  configuration")
    for runs in results.values():
        for r in runs:
            print(f"{r['job']:<12} {r['phase']:<10} {r['pool']:<11} {r['price_per_hour']:>5.2f} {r['usable_mib']:>7.0f} "
                  f"{r['predicted_peak_mib']:>7.1f} {r['measured_allocated_mib'] or 0:>7.1f} "
                  f"{r['measured_reserved_mib'] or 0:>8.1f} {r['measured_device_mib'] or 0:>7.1f} "
                  f"{r['predicted_step_seconds']:>11.2e} {r['measured_step_seconds'] or 0:>10.3f}  {r['configuration']}")
    print("MiB; pred = predicted per-GPU peak with the device terms learned so far; alloc = real CPU allocator "
          "peak (largest rank); reserved/device = simulated GPU on top of it")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "downsizing.json")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="memfit-downsizing-"))
    cluster = testcluster.TestCluster(workdir=work, die_with_parent=True)
    started = time.monotonic()
    cluster.start()
    try:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        kube = Kube(api_client=api_client, logs=lambda: cluster.log_tail(20))
        os.system(f"KUBECONFIG={cluster.kubeconfig} kubectl apply --server-side -f {REPO / 'crds'} >/dev/null")
        os.system(f"KUBECONFIG={cluster.kubeconfig} kubectl wait --for=condition=Established crd --all >/dev/null")
        namespace = "downsizing"
        kube.core.create_namespace({"metadata": {"name": namespace}})
        with operator_process(cluster.kubeconfig, work / "operator.log"):
            time.sleep(3)
            results = run_scenarios(kube, KubeApi.from_client(api_client), namespace)
    finally:
        cluster.stop()
    down, up = results["down"], results["up"]
    summary = {
        "down_first_pool": down[0]["pool"], "down_later_pools": [r["pool"] for r in down[1:]],
        "down_price_per_hour": [r["price_per_hour"] for r in down],
        "down_all_succeeded": all(r["phase"] == "Succeeded" for r in down),
        "up_pools": [r["pool"] for r in up], "up_all_succeeded": all(r["phase"] == "Succeeded" for r in up),
        "down_estimated_cost": [r["estimated_cost"] for r in down],
        # A run moved to a cheaper pool is also predicted to cost less (issue #30: CPU step times were
        # learned as GPU speed, so later predictions were 4x slower and a 3x cheaper pool cost more).
        "cheaper_pool_costs_less": all(r["estimated_cost"] < down[0]["estimated_cost"] for r in down[1:]
                                       if r["price_per_hour"] < down[0]["price_per_hour"]),
        # The same configuration on the same pool is predicted the same step time in every run: nothing is
        # learned from the simulated device's (CPU) step times.
        "no_step_time_learned_from_the_simulated_device": all(
            abs(a["predicted_step_seconds"] - b["predicted_step_seconds"]) <= 1e-3 * b["predicted_step_seconds"]
            for runs in (down, up) for a in runs for b in runs
            if (a["pool"], a["configuration"]) == (b["pool"], b["configuration"])),
        "later_predictions_cover_the_measured_device_peak": all(
            r["measured_device_mib"] is None or r["predicted_peak_mib"] >= r["measured_device_mib"]
            for runs in (down[1:], up[1:]) for r in runs),
    }
    report = {
        "command": "python benchmarks/downsizing.py",
        "machine": {"cpus": os.cpu_count(), "note": "CPU only: trainer on CPU, GPU reservation and context simulated"},
        "wall_seconds": round(time.monotonic() - started, 1),
        "summary": summary,
        "scenarios": {"down": {"simulated_gpu": d.DOWN.simulated_gpu, "pools": d.DOWN.pools(), "runs": down},
                      "up": {"simulated_gpu": d.UP.simulated_gpu, "pools": d.UP.pools(), "runs": up}},
        "provenance": stamp(MEASURES),
    }
    print_table(results)
    print(json.dumps(summary, indent=1))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
    ok = (summary["down_all_succeeded"] and summary["up_all_succeeded"] and summary["cheaper_pool_costs_less"]
          and summary["no_step_time_learned_from_the_simulated_device"])
    return 0 if ok and summary["down_later_pools"] and set(summary["down_later_pools"]) == {"down-small"} else 1


if __name__ == "__main__":
    sys.exit(main())

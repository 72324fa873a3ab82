"""Benchmark: memfit's reliability on the real local control plane (issue 8 §1-4, 6).

One chaos cluster (KWOK simulates every pod: profiler, OOMs, long-running trainers, faults; see
memfit_testbed.reliability.chaos_stages), one namespace and one `memfit operator` process per section:

1. crashes: 50 MOTJ lifecycles while the operator is SIGKILLed at least 100 times at random points
   and restarted; then every write of three lifecycles crashed after in turn (in-process);
2. outages: kube-apiserver restarted 5 times (etcd kept) with jobs in flight;
3. fuzz: at least 500 hypothesis-generated hostile specs against the real API server;
4. faults: profiling pod crash and timeout, OOM at step k, a pool's nodes removed, the plan ConfigMap
   deleted, a trainer pod pre-empted, training pods refused; and (with the pod runner, unless
   --no-real-trainer) a real trainer process SIGKILLed;
6. security: the builders over generated specs, a `restricted` namespace with canary secrets;
7. real node (issue 15): lifecycles whose profiler and trainer run as containers on a real kubelet
   while the host operator is SIGKILLed at random moments; the same invariants (skipped, with the
   reason, where the machine cannot run a real node; not in --quick).

Prints a table and writes benchmarks/results/reliability.json (`--quick`: reliability-quick.json,
10 lifecycles / 20 kills, 2 restarts, 100 specs, KWOK faults only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability import chaos, faults, fuzz, outage, security
from memfit_testbed.reliability.crash import EXPECTED, Campaign, lifecycle_doc, make_roomy, run_campaign
from memfit_testbed.reliability.crashpoints import Run, count_writes, drive, start_crash_runs
from memfit_testbed.reliability.invariants import JobRecorder, check_world
from memfit_testbed.reliability.realnode_campaign import run_real_node_campaign
from provenance import stamp

REPO = Path(__file__).resolve().parent.parent
# The sources this benchmark measures (a change to any of them makes its result stale).
MEASURES = ["operator/memfit", "hack/memfit_testbed", "hack/kwok", "benchmarks/reliability.py",
            "trainer-image/memfit_trainer"]


def section(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    print(f"--- {name} ...", flush=True)
    t0 = time.monotonic()
    try:
        result = run()
    except Exception as error:  # a section that breaks is reported, the others still run
        result = {"error": f"{type(error).__name__}: {error}"[:2000]}
    result["seconds"] = round(time.monotonic() - t0, 1)
    print(f"--- {name}: {result['seconds']} s", flush=True)
    return result


def crashes(cc: chaos.ChaosCluster, work: Path, lifecycles: int, kills: int) -> dict[str, Any]:
    namespace = chaos.new_namespace(cc, "crash")
    result = run_campaign(cc, namespace, Campaign(lifecycles=lifecycles, kills=kills), work)
    return result.summary() | {"orphan_examples": result.leftovers_after_delete[:5]}


def crash_points(cc: chaos.ChaosCluster) -> dict[str, Any]:
    """For plain, OOM and profiled lifecycles: crash right after each API write in turn."""
    namespace = chaos.new_namespace(cc, "crashpoints")
    make_roomy(cc)
    recorder = JobRecorder(cc.kube, namespace).start()
    expected: dict[str, tuple[str, list[str]]] = {}
    points: dict[str, int] = {}
    runs: list[Run] = []
    for kind in ("plain", "oom-once", "profiled"):
        doc = lifecycle_doc(kind, 0)
        seed_profile(cc.api, namespace, doc)
        clean = json.loads(json.dumps(doc))
        clean["metadata"]["name"] = f"clean-{kind}"
        writes = count_writes(cc, namespace, clean)
        expected[clean["metadata"]["name"]] = EXPECTED[kind]
        points[kind] = len(writes)
        kind_runs = start_crash_runs(cc, namespace, doc, kind, writes)
        expected.update({r.name: EXPECTED[kind] for r in kind_runs})
        runs += kind_runs
    drive(cc, namespace, runs, timeout=600)
    report = check_world(cc.kube, namespace, recorder=recorder, expected=expected)
    recorder.stop()
    return {
        "write_points": points,
        "crashes_injected": sum(bool(r.crashed_at) for r in runs),
        **report.summary(),
    }


def outages(cc: chaos.ChaosCluster, work: Path, restarts: int) -> dict[str, Any]:
    namespace = chaos.new_namespace(cc, "outage")
    op = chaos.operator_for(cc, namespace, work / "operator-outage.log")
    try:
        result = outage.run_restarts(cc, namespace, op, restarts=restarts, long_jobs=4, jobs_between=2)
    finally:
        alive = op.alive()
        op.stop()
    return result.summary() | {"operator_alive_at_end": alive}


def fuzzing(cc: chaos.ChaosCluster, work: Path, count: int, seed: int) -> dict[str, Any]:
    cases = fuzz.draw_cases(count, seed)
    namespace = chaos.new_namespace(cc, "fuzz")
    op = chaos.operator_for(cc, namespace, work / "operator-fuzz.log")
    summary = fuzz.FuzzSummary()
    try:
        for case in cases:
            summary.verdicts.append(fuzz.judge(cc.kube, namespace, case, wait_seconds=20))
    finally:
        op.check_crash()
        crashes_seen, tracebacks, alive = len(op.crashes), op.tracebacks(), op.alive()
        op.stop()
    return summary.counts() | {
        "hypothesis_seed": seed,
        "operator_crashes": crashes_seen,
        "operator_logged_errors": tracebacks,
        "operator_alive_at_end": alive,
    }


def injected_faults(cc: chaos.ChaosCluster, work: Path, real_trainer: bool) -> dict[str, Any]:
    make_roomy(cc)
    namespace = chaos.new_namespace(cc, "faults")
    op = chaos.operator_for(cc, namespace, work / "operator-faults.log")
    results = []
    try:
        for name, scenario in faults.KWOK_FAULTS.items():
            try:
                if scenario is faults.plan_configmap_deleted:
                    results.append(scenario(cc, namespace, 1.0).summary())
                else:
                    results.append(scenario(cc, namespace).summary())
            except Exception as error:
                results.append(
                    {"name": name, "ok": False, "observed": f"{type(error).__name__}: {error}"[:600]}
                )
        leftover = faults.consistent(cc, namespace)
    finally:
        op.check_crash()
        crashes_seen, tracebacks = len(op.crashes), op.tracebacks()
        op.stop()
    if real_trainer:
        results.append(real_trainer_killed(work))
    return {
        "injected": len(results),
        "ended_in_documented_state": sum(bool(r.get("ok")) for r in results),
        "operator_crashes": crashes_seen,
        "operator_logged_errors": tracebacks,
        "invariant_violations": leftover,
        "scenarios": results,
    }


def real_trainer_killed(work: Path) -> dict[str, Any]:
    """A real trainer process SIGKILLed under the pod runner (its own cluster, as the tests use)."""
    import signal

    from kubernetes import config
    from memfit_testbed import testcluster
    from memfit_testbed.cluster_helpers import Kube
    from memfit_testbed.operator_helpers import (
        apply_pools,
        create_job,
        operator_process,
        quickstart,
        wait_phase,
    )

    t0 = time.monotonic()
    cluster = testcluster.TestCluster(
        workdir=work / "pod-runner-cluster", pod_runner=True, die_with_parent=True
    )
    cluster.start()
    try:
        from memfit_testbed import kwok_pools

        kwok_pools.apply_pools(str(cluster.kubeconfig))
        chaos.install_crds(cluster.kubeconfig)
        kube = Kube(
            config.new_client_from_config(config_file=str(cluster.kubeconfig)), lambda: cluster.log_tail(30)
        )
        apply_pools(kube)
        namespace = "killed"
        kube.core.create_namespace({"metadata": {"name": namespace}})
        kube.wait(
            "default SA",
            lambda: kube.raw(kube.core.read_namespaced_service_account, "default", namespace),
            60,
        )
        doc = quickstart("killed", training={"globalBatchSize": 8, "maxSteps": 400, "optimizer": "adamw"})
        log = work / "operator-real.log"
        selector = "memfit.dev/job=killed,memfit.dev/component=trainer"
        with operator_process(cluster.kubeconfig, log, "--namespace", namespace):
            create_job(kube, namespace, doc)
            pid = kube.wait(
                "a running trainer", lambda: _trainer_pid(kube.pods(namespace, selector)), timeout=300
            )
            time.sleep(2.0)
            os.kill(pid, signal.SIGKILL)
            job = wait_phase(kube, namespace, "killed", ("Succeeded", "Failed"), 420, log)
        train = kube.raw(kube.batch.read_namespaced_job, "killed-train-0", namespace) or {}
        outcomes = [a["outcome"] for a in job["status"]["attempts"]]
        failed_pods = int((train.get("status") or {}).get("failed") or 0)
        ok = job["status"]["phase"] == "Succeeded" and outcomes == ["Succeeded"] and failed_pods == 1
        return {
            "name": "trainer process killed (real trainer, pod runner)",
            "injected": "SIGKILL of the running trainer process",
            "expected": "the Job retries the pod (backoffLimit 3), same attempt Succeeded",
            "observed": f"{job['status']['phase']} {outcomes}, training Job failed pods {failed_pods}",
            "ok": ok,
            "seconds": round(time.monotonic() - t0, 1),
        }
    finally:
        cluster.stop()


def _trainer_pid(pods: list[dict[str, Any]]) -> int | None:
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            cid = str(status.get("containerID") or "")
            if cid.startswith("memfit-local://") and (status.get("state") or {}).get("running"):
                return int(cid.removeprefix("memfit-local://"))
    return None


def security_checks(cc: chaos.ChaosCluster, work: Path, examples: int) -> dict[str, Any]:
    pools = security.catalog_pools()
    specs: list[dict[str, Any]] = []

    @settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(raw=security.valid_specs())
    def collect(raw: dict[str, Any]) -> None:
        specs.append(raw)

    collect()
    violations = [v for raw in specs for v in security.builder_violations(raw, pools)]
    found = security.restricted_run(cc, work / "operator-security.log")
    rbac = (REPO / "charts" / "memfit" / "templates" / "_rbac.tpl").read_text()
    return {
        "generated_specs_built": len(specs),
        "builder_violations": violations[:20],
        "rbac_grants_secrets": any(
            "secret" in line.lower() for line in rbac.splitlines() if "resources:" in line
        ),
        "restricted_namespace": found,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="memfit-reliability-"))
    cc = chaos.ChaosCluster(work / "cluster")
    cc.start()
    out: dict[str, Any] = {
        "benchmark": "reliability on the local control plane (KWOK pods; chaos stages)",
        "machine": f"{os.cpu_count()} cores shared with other engineers; {platform.python_implementation()} "
        f"{platform.python_version()}",
        "command": "python benchmarks/reliability.py" + (" --quick" if args.quick else ""),
    }
    try:
        out["crashes"] = section("crashes", lambda: crashes(cc, work, args.lifecycles, args.kills))
        out["crash_after_every_write"] = section("crash after every write", lambda: crash_points(cc))
        out["apiserver_restarts"] = section("API server restarts", lambda: outages(cc, work, args.restarts))
        out["fuzz"] = section("fuzz", lambda: fuzzing(cc, work, args.specs, args.seed))
        out["faults"] = section("faults", lambda: injected_faults(cc, work, args.real_trainer))
        out["security"] = section("security", lambda: security_checks(cc, work, args.security_examples))
    finally:
        cc.stop()
    if args.realnode_lifecycles:
        out["real_node"] = section("real node", lambda: run_real_node_campaign(
            work, lifecycles=args.realnode_lifecycles, kills=args.realnode_kills))
    out["load_average_at_end"] = round(os.getloadavg()[0], 1)
    out["totals"] = totals(out)
    return out


def totals(out: dict[str, Any]) -> dict[str, Any]:
    """The headline counts: faults injected and survived, duplicates, orphans, crashes."""
    c, p, a, f, x, s, r = (
        out.get(k, {})
        for k in ("crashes", "crash_after_every_write", "apiserver_restarts", "fuzz", "faults", "security",
                  "real_node")
    )
    injected = (
        c.get("sigkills", 0)
        + p.get("crashes_injected", 0)
        + a.get("apiserver_restarts", 0)
        + x.get("injected", 0)
    )
    return {
        "faults_injected": injected,
        "sigkills": c.get("sigkills", 0),
        "crash_points": p.get("crashes_injected", 0),
        "apiserver_restarts": a.get("apiserver_restarts", 0),
        "injected_faults": x.get("injected", 0),
        "injected_faults_in_documented_state": x.get("ended_in_documented_state", 0),
        "jobs_checked": c.get("jobs", 0) + p.get("jobs", 0) + a.get("jobs", 0) + r.get("jobs", 0),
        "real_node_jobs": r.get("jobs", 0),
        "real_node_sigkills": r.get("sigkills", 0),
        "stuck": c.get("stuck", 0) + p.get("stuck", 0) + a.get("stuck", 0) + r.get("stuck", 0),
        "duplicate_training_jobs": sum(d.get("duplicate_training_jobs", 0) for d in (c, p, a, r)),
        "orphans": c.get("orphans", 0)
        + c.get("orphans_after_delete", 0)
        + p.get("orphans", 0)
        + a.get("orphans", 0)
        + r.get("orphans", 0)
        + r.get("orphans_after_delete", 0),
        "status_inconsistent": sum(d.get("status_inconsistent", 0) for d in (c, p, a, r)),
        "unexpected_outcomes": sum(d.get("unexpected_outcome", 0) for d in (c, p, a, r)),
        "explained_outcomes": sum(d.get("explained_outcome", 0) for d in (c, p, a, r)),
        "hostile_specs": f.get("specs", 0),
        "hostile_specs_refused_naming_the_field": f.get("passed", 0),
        "hostile_spec_children": f.get("children_created", 0),
        "operator_crashes": sum(d.get("operator_crashes", 0) for d in (c, a, f, x, r)),
        "operator_logged_errors": sum(d.get("operator_logged_errors", 0) for d in (c, a, f, x)),
        "security_violations": len(s.get("builder_violations", []))
        + len((s.get("restricted_namespace") or {}).get("pod_violations", []))
        + len((s.get("restricted_namespace") or {}).get("secrets_in_objects", []))
        + len((s.get("restricted_namespace") or {}).get("secrets_in_operator_log", [])),
        "errors": [k for k, v in out.items() if isinstance(v, dict) and "error" in v],
    }


def table(out: dict[str, Any]) -> str:
    t = out["totals"]
    c, a, f, x, r = (out.get(k, {}) for k in ("crashes", "apiserver_restarts", "fuzz", "faults", "real_node"))
    rows = [
        (
            "lifecycles / SIGKILLs",
            f"{c.get('lifecycles')} / {c.get('sigkills')} ({c.get('sigkills_with_jobs_in_flight')} with jobs in flight)",
            ">= 50 / >= 100",
        ),
        ("crash points (after each write)", str(t["crash_points"]), ""),
        (
            "real node: lifecycles / SIGKILLs",
            (f"skipped: {r['skipped']}"[:60] if "skipped" in r else
             f"{r.get('lifecycles')} / {r.get('sigkills')} ({r.get('sigkills_with_jobs_in_flight')} in flight), "
             f"{r.get('phases')}"),
            "all Succeeded, invariants hold",
        ),
        ("API server restarts", f"{a.get('apiserver_restarts')} ({a.get('jobs')} jobs in flight)", "5"),
        (
            "hostile specs",
            f"{f.get('specs')}: {f.get('rejected_by_api_server')} rejected, {f.get('admitted')} admitted",
            ">= 500",
        ),
        ("  refused naming the field", str(t["hostile_specs_refused_naming_the_field"]), "all"),
        (
            "injected faults in documented state",
            f"{t['injected_faults_in_documented_state']} / {t['injected_faults']}",
            "all",
        ),
        ("jobs checked", str(t["jobs_checked"]), ""),
        ("stuck", str(t["stuck"]), "0"),
        ("duplicate training Jobs", str(t["duplicate_training_jobs"]), "0"),
        ("orphans", str(t["orphans"]), "0"),
        ("status inconsistent with children", str(t["status_inconsistent"]), "0"),
        ("unexpected outcomes", str(t["unexpected_outcomes"]), "0"),
        ("  explained (nodes not Ready, or GPUs all held, while waiting)", str(t["explained_outcomes"]), ""),
        ("children of hostile specs", str(t["hostile_spec_children"]), "0"),
        (
            "operator crashes / logged tracebacks",
            f"{t['operator_crashes']} / {t['operator_logged_errors']}",
            "0 / 0",
        ),
        ("security violations", str(t["security_violations"]), "0"),
    ]
    for s in x.get("scenarios", []):
        rows.append(
            (
                f"  fault: {s.get('name')}",
                ("ok: " if s.get("ok") else "FAILED: ") + str(s.get("observed"))[:70],
                "",
            )
        )
    width = max(len(r[0]) for r in rows)
    lines = [f"{'figure':<{width}}  {'value':<60}  target", "-" * (width + 72)]
    lines += [f"{a_:<{width}}  {b:<60}  {c_}" for a_, b, c_ in rows]
    if t["errors"]:
        lines.append(f"sections with errors: {t['errors']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small counts, KWOK faults only")
    ap.add_argument("--lifecycles", type=int, default=None)
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--restarts", type=int, default=None)
    ap.add_argument("--specs", type=int, default=None)
    ap.add_argument("--seed", type=int, default=8, help="hypothesis seed of the hostile specs")
    ap.add_argument("--security-examples", type=int, default=200)
    ap.add_argument("--no-real-trainer", dest="real_trainer", action="store_false")
    ap.add_argument("--realnode-lifecycles", type=int, default=None, help="real-node section (0: skip it)")
    ap.add_argument("--realnode-kills", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.realnode_lifecycles is None:
        args.realnode_lifecycles = 0 if args.quick else 6
    args.lifecycles = args.lifecycles or (10 if args.quick else 50)
    args.kills = args.kills or (20 if args.quick else 100)
    args.restarts = args.restarts or (2 if args.quick else 5)
    args.specs = args.specs or (100 if args.quick else 520)
    if args.quick:
        args.real_trainer = False
        args.security_examples = min(args.security_examples, 50)
    out_path = args.json or REPO / "benchmarks" / "results" / (
        "reliability-quick.json" if args.quick else "reliability.json"
    )
    out = run(args)
    print(table(out))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out["provenance"] = stamp(MEASURES)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {out_path}")
    t = out["totals"]
    clean = not t["errors"] and not any(
        t[k]
        for k in (
            "stuck",
            "duplicate_training_jobs",
            "orphans",
            "status_inconsistent",
            "operator_crashes",
            "security_violations",
        )
    )
    return 0 if clean and t["injected_faults_in_documented_state"] == t["injected_faults"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The operator SIGKILLed at random points and at every write: no duplicate training Job, nothing stuck,
no orphans, status consistent with the children (fast variants of benchmarks/reliability.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from memfit_testbed.profiles import seed_profile
from memfit_testbed.reliability.chaos import ChaosCluster, new_namespace
from memfit_testbed.reliability.crash import EXPECTED, Campaign, lifecycle_doc, make_roomy, run_campaign
from memfit_testbed.reliability.crashpoints import count_writes, drive, start_crash_runs
from memfit_testbed.reliability.invariants import JobRecorder, check_world

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.extended]  # the campaign checks it at every stop: docs/testing.md


def test_sigkill_cycles_keep_every_invariant(chaos_cluster: ChaosCluster, tmp_path: Path) -> None:
    namespace = new_namespace(chaos_cluster, "crash")
    result = run_campaign(chaos_cluster, namespace, Campaign(lifecycles=6, kills=8, max_uptime=3.0), tmp_path)
    summary = result.summary()
    assert result.kills == 8 and result.operator_starts == 9, summary
    assert result.report.ok, summary
    assert summary["jobs"] == summary["terminal"] > 0, summary
    assert summary["duplicate_training_jobs"] == 0 and summary["orphans"] == 0, summary
    assert result.operator_crashes == [] and result.operator_logged_errors == 0, summary
    assert result.leftovers_after_delete == [], summary


@pytest.mark.parametrize("kind", ["plain", "oom-once", "profiled"])
def test_crash_after_every_write_ends_like_a_clean_run(chaos_cluster: ChaosCluster, kind: str) -> None:
    """Reconcile in-process and die right after each API write of a clean run of the lifecycle."""
    namespace = new_namespace(chaos_cluster, f"cp-{kind}")
    make_roomy(chaos_cluster)
    recorder = JobRecorder(chaos_cluster.kube, namespace).start()
    doc = lifecycle_doc(kind, 0)
    seed_profile(chaos_cluster.api, namespace, doc)
    clean = copy.deepcopy(doc)
    clean["metadata"]["name"] = f"clean-{kind}"
    writes = count_writes(chaos_cluster, namespace, clean)
    assert len(writes) >= 8, writes
    runs = start_crash_runs(chaos_cluster, namespace, doc, kind, writes)
    expected = {name: EXPECTED[kind] for name in [clean["metadata"]["name"], *(r.name for r in runs)]}
    drive(chaos_cluster, namespace, runs, timeout=240)
    # Every distinct write was crashed after. A run that never makes its write finishes uncrashed: KWOK
    # pods may finish before a pass sees them Running, and a profiling lifecycle repeats ensures a
    # varying number of times while it waits (only the first occurrence is certain).
    crashed = {r.crashed_at for r in runs}
    assert set(writes) - crashed <= {"status Running", "event PodsRunning"}, sorted(set(writes) - crashed)
    report = check_world(chaos_cluster.kube, namespace, recorder=recorder, expected=expected)
    recorder.stop()
    assert report.ok, report.summary()
    assert report.terminal == len(writes) + 1

"""The Queued condition of jobs with scheduling.kueueQueue (memfit.lifecycle.queueing), from the Workload."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lifecycle_harness import T0, Harness, quickstart
from memfit.api.job import Phase
from memfit.lifecycle.snapshot import QUOTA_RECHECK_SECONDS

QUEUE = {"kueueQueue": "team-a"}
NO_QUOTA = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor "
            "t4-spot, 1 more needed")


def workload(h: Harness, job: str, **conditions: tuple[str, str, str]) -> None:
    """Kueue's Workload for Job `job` (labelled with the Job's uid, as Kueue does)."""
    h.job(job)["metadata"]["uid"] = f"uid-{job}"
    h.objects[("Workload", f"job-{job}")] = {
        "metadata": {"name": f"job-{job}", "labels": {"kueue.x-k8s.io/job-uid": f"uid-{job}"}},
        "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                  for t, (s, r, m) in conditions.items()]},
    }


def admit(h: Harness, job: str) -> None:
    h.job(job)["spec"]["suspend"] = False


def test_profiling_job_goes_through_the_queue() -> None:
    h = Harness(spec=quickstart(scheduling=QUEUE))
    h.reconcile()
    job: dict[str, Any] = h.job("j-profile")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]

    h.reconcile()  # Kueue has not made the Workload yet
    assert h.condition("Queued")[:2] == ("True", "WorkloadNotFound")

    workload(h, "j-profile", QuotaReserved=("False", "Pending", NO_QUOTA))
    decision = h.reconcile()
    status, reason, message = h.condition("Queued")
    assert (status, reason) == ("True", "Pending")
    assert message == f"profiling Job j-profile waits in LocalQueue team-a (Pending: {NO_QUOTA})"
    assert decision.reasons() == ["Queued"]
    assert h.stored.phase == Phase.PROFILING
    assert h.reconcile().events == ()  # no event again while the reason stays

    admit(h, "j-profile")
    h.reconcile()
    assert h.condition("Queued") == ("False", "Admitted",
                                     "profiling Job j-profile admitted by Kueue from LocalQueue team-a")


def test_inadmissible_queue_is_named() -> None:
    h = Harness(spec=quickstart(scheduling=QUEUE))
    h.reconcile()
    workload(h, "j-profile", QuotaReserved=("False", "Inadmissible", "LocalQueue team-a doesn't exist"))
    h.reconcile()
    assert h.condition("Queued")[1:] == (
        "Inadmissible", "profiling Job j-profile waits in LocalQueue team-a (Inadmissible: LocalQueue team-a "
        "doesn't exist)")


def test_training_job_waits_queued_then_runs() -> None:
    h = Harness(spec=quickstart(scheduling=QUEUE))
    h.seed_profile()
    h.reconcile()
    assert h.job("j-train-0")["spec"]["suspend"] is True
    workload(h, "j-train-0", QuotaReserved=("False", "Pending", NO_QUOTA))
    h.reconcile()
    assert h.condition("Queued")[:2] == ("True", "Pending")
    assert h.condition("Running")[:2] == ("False", "WaitingForAdmission")
    admit(h, "j-train-0")
    h.start("j-train-0")
    h.add_pod("j-train-0")
    h.reconcile()
    assert h.condition("Queued")[:2] == ("False", "Admitted")
    assert h.stored.phase == Phase.RUNNING


def test_job_without_queue_has_no_queued_condition() -> None:
    h = Harness()
    h.reconcile()
    assert h.job("j-profile")["spec"]["suspend"] is False
    assert all(c.type != "Queued" for c in h.stored.conditions)


# --- quota-aware planning (memfit.lifecycle.quota) ---------------------------------------------------
def cluster_queue(nominal: dict[str, int], reserved: dict[str, int]) -> dict[str, Any]:
    def resources(gpus: int) -> list[dict[str, Any]]:
        return [{"name": "cpu", "nominalQuota": "1000"}, {"name": "nvidia.com/gpu", "nominalQuota": gpus}]

    return {
        "metadata": {"name": "cq"},
        "spec": {"resourceGroups": [{"coveredResources": ["cpu", "nvidia.com/gpu"],
                                     "flavors": [{"name": f, "resources": resources(n)} for f, n in nominal.items()]}]},
        "status": {"flavorsReservation": [{"name": f, "resources": [{"name": "nvidia.com/gpu", "total": str(n)}]}
                                          for f, n in reserved.items()]},
    }


def queued_harness(nominal: dict[str, int], reserved: dict[str, int]) -> Harness:
    h = Harness(spec=quickstart(scheduling=QUEUE, placement={"maxNodes": 1}))
    h.objects[("LocalQueue", "team-a")] = {"metadata": {"name": "team-a"}, "spec": {"clusterQueue": "cq"}}
    h.objects[("ClusterQueue", "cq")] = cluster_queue(nominal, reserved)
    h.seed_profile()
    return h


def test_parse_cluster_queue() -> None:
    from memfit.lifecycle.quota import parse_cluster_queue

    quota = parse_cluster_queue(cluster_queue({"t4-spot": 2, "l4-ondemand": 8}, {"t4-spot": 2, "l4-ondemand": 3}))
    assert (quota.free("t4-spot"), quota.free("l4-ondemand"), quota.free("a100-80-ondemand")) == (0, 5, 0)
    assert quota.describe() == "ClusterQueue cq GPU quota free/nominal: l4-ondemand 5/8, t4-spot 0/2"


def test_plan_skips_the_pool_whose_quota_is_used_up() -> None:
    free = queued_harness({"t4-spot": 1, "l4-ondemand": 4}, {})
    free.reconcile()
    assert free.stored.plan is not None and free.stored.plan.node_pool == "t4-spot"  # cheapest, with quota

    used = queued_harness({"t4-spot": 1, "l4-ondemand": 4}, {"t4-spot": 1})
    used.reconcile()
    assert used.stored.plan is not None and used.stored.plan.node_pool == "l4-ondemand"
    assert used.job("j-train-0")["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"}


def test_no_quota_free_anywhere_waits_for_it() -> None:
    h = queued_harness({"t4-spot": 1}, {"t4-spot": 1})
    h.reconcile()
    status, reason, message = h.condition("Planned")
    assert (status, reason) == ("False", "WaitingForCapacity")
    assert "ClusterQueue cq GPU quota free/nominal: t4-spot 0/1" in message
    assert ("Job", "j-train-0") not in h.objects


def test_a_queue_without_quota_for_any_fitting_pool_is_no_fit() -> None:
    h = queued_harness({}, {})
    h.reconcile()
    status, reason, message = h.condition("Failed")
    assert (status, reason) == ("True", "NoFit")
    assert "ClusterQueue cq GPU quota free/nominal: none" in message


# --- a pool whose quota stays used up (memfit.lifecycle.queued) ----------------------------------------
def test_a_job_not_admitted_for_the_capacity_timeout_moves_to_a_pool_with_quota() -> None:
    """Planned onto t4-spot while it had quota; another workload took it. After capacityTimeoutSeconds in
    the queue, l4-ondemand has quota for a plan now: the attempt ends NoCapacity and the job re-plans
    there (t4-spot excluded). Before the timeout, and while no other pool has quota, it keeps its place."""
    h = queued_harness({"t4-spot": 1, "l4-ondemand": 0}, {})
    h.reconcile()
    assert h.stored.plan is not None and h.stored.plan.node_pool == "t4-spot"
    h.objects[("ClusterQueue", "cq")] = cluster_queue({"t4-spot": 1, "l4-ondemand": 0}, {"t4-spot": 1})
    workload(h, "j-train-0", QuotaReserved=("False", "Pending", NO_QUOTA))
    h.later(60)
    h.reconcile()
    assert h.condition("Running")[:2] == ("False", "WaitingForAdmission") and len(h.stored.attempts) == 1
    h.later(600)  # past the default capacityTimeoutSeconds, but l4-ondemand has no quota either
    h.reconcile()
    status, reason, message = h.condition("Running")
    assert (status, reason) == ("False", "WaitingForAdmission") and len(h.stored.attempts) == 1
    assert "it keeps its place in the queue" in message and "t4-spot 0/1" in message
    assert not h.job("j-train-0").get("metadata", {}).get("deletionTimestamp")

    h.objects[("ClusterQueue", "cq")] = cluster_queue({"t4-spot": 1, "l4-ondemand": 4}, {"t4-spot": 1})
    # The quota is looked at again QUOTA_RECHECK_SECONDS after the last look, not on every resync.
    h.later(QUOTA_RECHECK_SECONDS - 1)
    h.reconcile()
    assert h.stored.attempts[0].outcome.value == "Launching" and h.stored.attempts[0].quota_checked_at == T0 + \
        timedelta(seconds=660)
    h.later(1)
    decision = h.reconcile()
    assert h.stored.attempts[0].outcome.value == "NoCapacity"
    status, reason, message = h.condition("Running")
    assert (status, reason) == ("False", "NoQuota")
    assert message.startswith("LocalQueue team-a has not admitted training Job j-train-0 on t4-spot for 690s")
    assert "l4-ondemand has quota for" in message
    assert "NoQuota" in decision.reasons()
    h.reconcile()  # the re-plan: the suspended Job goes, attempt 1 on l4-ondemand, through the queue
    assert ("Job", "j-train-0") not in h.objects
    assert h.stored.attempts[1].node_pool == "l4-ondemand"
    job = h.job("j-train-1")
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"}


# --- a queued profiling Job (memfit.lifecycle.profiling) ----------------------------------------------
def profiling_harness(nominal: dict[str, int], reserved: dict[str, int]) -> Harness:
    h = Harness(spec=quickstart(scheduling=QUEUE, placement={"maxNodes": 1}))
    h.objects[("LocalQueue", "team-a")] = {"metadata": {"name": "team-a"}, "spec": {"clusterQueue": "cq"}}
    h.objects[("ClusterQueue", "cq")] = cluster_queue(nominal, reserved)
    return h


def test_profiling_goes_to_the_cheapest_pool_with_free_quota() -> None:
    free = profiling_harness({"t4-spot": 1, "l4-ondemand": 4}, {})
    free.reconcile()
    assert free.job("j-profile")["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "t4-spot"}
    used = profiling_harness({"t4-spot": 1, "l4-ondemand": 4}, {"t4-spot": 1})
    used.reconcile()
    assert used.job("j-profile")["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"}


def test_a_queued_profiling_job_moves_to_a_pool_with_quota_after_the_capacity_timeout() -> None:
    """Placed on t4-spot while it had quota; another workload took it. Past capacityTimeoutSeconds, with
    l4-ondemand quota free, the profiling Job is deleted and made again on l4-ondemand, through the queue.
    Before that, and while no other pool has quota, it keeps its place."""
    h = profiling_harness({"t4-spot": 1, "l4-ondemand": 0}, {})
    h.reconcile()
    assert h.job("j-profile")["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "t4-spot"}
    h.objects[("ClusterQueue", "cq")] = cluster_queue({"t4-spot": 1, "l4-ondemand": 0}, {"t4-spot": 1})
    workload(h, "j-profile", QuotaReserved=("False", "Pending", NO_QUOTA))
    h.reconcile()
    assert h.condition("Queued")[:2] == ("True", "Pending")
    h.later(700)  # past capacityTimeoutSeconds (600), but no other pool has quota: it keeps its place
    h.reconcile()
    assert h.condition("Queued")[:2] == ("True", "Pending") and ("Job", "j-profile") in h.objects

    h.objects[("ClusterQueue", "cq")] = cluster_queue({"t4-spot": 1, "l4-ondemand": 4}, {"t4-spot": 1})
    decision = h.reconcile()
    status, reason, message = h.condition("Queued")
    assert (status, reason) == ("False", "NoQuota")
    assert message.startswith("LocalQueue team-a has not admitted profiling Job j-profile on t4-spot for 700s")
    assert message.endswith("profiling on l4-ondemand, which has quota")
    assert "NoQuota" in decision.reasons() and h.stored.phase == Phase.PROFILING
    h.reconcile()
    job = h.job("j-profile")
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "l4-ondemand"}
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_a_named_profiling_pool_is_never_moved() -> None:
    h = Harness(spec=quickstart(scheduling=QUEUE, placement={"maxNodes": 1}, profiling={"nodePool": "t4-spot"}))
    h.objects[("LocalQueue", "team-a")] = {"metadata": {"name": "team-a"}, "spec": {"clusterQueue": "cq"}}
    h.objects[("ClusterQueue", "cq")] = cluster_queue({"t4-spot": 1, "l4-ondemand": 4}, {"t4-spot": 1})
    h.reconcile()
    workload(h, "j-profile", QuotaReserved=("False", "Pending", NO_QUOTA))
    h.reconcile()
    h.later(700)
    h.reconcile()
    assert h.condition("Queued")[:2] == ("True", "Pending")
    assert h.job("j-profile")["spec"]["template"]["spec"]["nodeSelector"] == {"memfit.dev/pool": "t4-spot"}


# --- borrowing from a cohort (memfit.lifecycle.quota) ---------------------------------------------------
def cohort_queue(name: str, cohort: str, nominal: dict[str, int], reserved: dict[str, int],
                 **limits: dict[str, int]) -> dict[str, Any]:
    cq = cluster_queue(nominal, reserved)
    cq["metadata"]["name"] = name
    cq["spec"]["cohortName"] = cohort
    for flavor in cq["spec"]["resourceGroups"][0]["flavors"]:
        for res in flavor["resources"]:
            if res["name"] == "nvidia.com/gpu":
                for key, per_flavor in limits.items():  # borrowingLimit / lendingLimit
                    if flavor["name"] in per_flavor:
                        res[key] = per_flavor[flavor["name"]]
    return cq


def test_quota_counts_what_the_cohort_lends() -> None:
    from memfit.lifecycle.quota import parse_cluster_queue

    mine = cohort_queue("cq", "org", {"t4-spot": 1, "l4-ondemand": 0}, {"t4-spot": 1})
    idle = cohort_queue("research", "org", {"t4-spot": 2, "l4-ondemand": 4}, {"l4-ondemand": 1})
    other_cohort = cohort_queue("elsewhere", "other", {"t4-spot": 8}, {})
    quota = parse_cluster_queue(mine, [mine, idle, other_cohort])
    # t4-spot: own 1 (used) + 2 lent by research, unused -> 2 free; l4-ondemand: 0 own + 4 lent, 1 used -> 3.
    assert (quota.free("t4-spot"), quota.free("l4-ondemand")) == (2, 3)
    assert (quota.nominal("t4-spot"), quota.nominal("l4-ondemand")) == (3, 4)
    assert quota.describe() == ("ClusterQueue cq (cohort org) GPU quota free/nominal: l4-ondemand 3/0 "
                                "(+4 borrowable), t4-spot 2/1 (+2 borrowable)")
    limited = cohort_queue("cq", "org", {"t4-spot": 1, "l4-ondemand": 0}, {"t4-spot": 1},
                           borrowingLimit={"t4-spot": 1, "l4-ondemand": 0})
    stingy = cohort_queue("research", "org", {"t4-spot": 2, "l4-ondemand": 4}, {"l4-ondemand": 1},
                          lendingLimit={"t4-spot": 0})
    quota = parse_cluster_queue(limited, [limited, stingy])
    assert (quota.free("t4-spot"), quota.free("l4-ondemand")) == (0, 0)
    assert parse_cluster_queue(limited, [limited, idle]).free("t4-spot") == 1  # borrowingLimit 1
    alone = parse_cluster_queue(cluster_queue({"t4-spot": 1}, {}), [idle])  # no cohort: nothing borrowed
    assert (alone.free("t4-spot"), alone.nominal("t4-spot")) == (1, 1)


def test_a_job_plans_onto_quota_its_queue_can_borrow() -> None:
    h = queued_harness({"t4-spot": 1}, {"t4-spot": 1})
    h.objects[("ClusterQueue", "cq")] = cohort_queue("cq", "org", {"t4-spot": 1, "l4-ondemand": 0}, {"t4-spot": 1})
    h.objects[("ClusterQueue", "research")] = cohort_queue("research", "org", {"t4-spot": 0, "l4-ondemand": 4}, {})
    h.reconcile()
    assert h.stored.plan is not None and h.stored.plan.node_pool == "l4-ondemand"


def test_between_two_looks_at_the_quota_nothing_is_written() -> None:
    """Past the capacity timeout the quota is looked at every QUOTA_RECHECK_SECONDS; the passes between
    two looks (resyncs) change nothing, so the status is not written on every resync."""
    h = queued_harness({"t4-spot": 1, "l4-ondemand": 0}, {})
    h.reconcile()
    h.objects[("ClusterQueue", "cq")] = cluster_queue({"t4-spot": 1, "l4-ondemand": 0}, {"t4-spot": 1})
    workload(h, "j-train-0", QuotaReserved=("False", "Pending", NO_QUOTA))
    h.later(660)
    h.reconcile()  # the first look
    looked = h.status
    assert "it keeps its place in the queue" in h.condition("Running")[2]
    assert h.stored.message.startswith("WaitingForAdmission: LocalQueue team-a has not admitted")
    for _ in range(5):
        h.later(5)
        h.reconcile()
        assert h.status == looked
    h.later(5)  # 30 s after the first look: the second, whose only change is when it looked
    h.reconcile()
    assert h.stored.attempts[0].quota_checked_at == T0 + timedelta(seconds=690)
    assert "it keeps its place in the queue" in h.condition("Running")[2]

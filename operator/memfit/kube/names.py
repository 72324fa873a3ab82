"""Deterministic child names and the labels memfit puts on everything it creates."""

from __future__ import annotations

GROUP = "memfit.dev"
LABEL_JOB = f"{GROUP}/job"
LABEL_COMPONENT = f"{GROUP}/component"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_POOL = f"{GROUP}/pool"
LABEL_PROBLEM = f"{GROUP}/problem-hash"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "memfit"
ANNOTATION_PLAN = f"{GROUP}/plan"
# Fault injection for tests and chaos drills: the trainer raises a simulated CUDA OOM at this step,
# in the first N attempts (default 1). Documented in docs/operator.md.
ANNOTATION_INJECT_OOM_STEP = f"{GROUP}/inject-oom-at-step"
ANNOTATION_INJECT_OOM_ATTEMPTS = f"{GROUP}/inject-oom-attempts"
# ... and multiplies its measured peak by this factor in the first N attempts (default 1), so that the
# first-steps check finds it over the plan (memfit_trainer/first_steps.py).
ANNOTATION_INJECT_PEAK_FACTOR = f"{GROUP}/inject-peak-factor"
ANNOTATION_INJECT_PEAK_ATTEMPTS = f"{GROUP}/inject-peak-attempts"
# ... and the trainer of this global rank (default every rank) kills itself (SIGKILL: no message, no
# cleanup) at this step of the first attempt: a crashed rank of a multi-node gang.
ANNOTATION_INJECT_KILL_STEP = f"{GROUP}/inject-kill-at-step"
ANNOTATION_INJECT_KILL_RANK = f"{GROUP}/inject-kill-rank"
# ... and every rank stalls at this step of the first attempt (a hung collective) until its pod is ended.
ANNOTATION_INJECT_HOLD_STEP = f"{GROUP}/inject-hold-at-step"

COMPONENT_PROFILER = "profiler"
COMPONENT_TRAINER = "trainer"
COMPONENT_PROFILE_CACHE = "profile-cache"

# A MOTJ name must leave room for `-train-NN` and the Indexed Job's `-N` pod suffix within 63.
MAX_JOB_NAME = 40
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # an Indexed Job pod's index


def profile_job_name(job: str) -> str:
    return f"{job}-profile"


def profile_input_name(job: str) -> str:
    """ConfigMap with the problem the profiler measures."""
    return f"{job}-profile"


def plan_config_map_name(job: str, attempt: int) -> str:
    return f"{job}-plan-{attempt}"


def train_job_name(job: str, attempt: int) -> str:
    return f"{job}-train-{attempt}"


def service_name(job: str) -> str:
    return job


def profile_cache_name(problem_hash: str) -> str:
    """Cached profile of a problem, shared by every job of that problem in the namespace."""
    return f"memfit-profile-{problem_hash[:16]}"


def job_labels(job: str, component: str) -> dict[str, str]:
    return {LABEL_JOB: job, LABEL_COMPONENT: component, LABEL_MANAGED_BY: MANAGED_BY}

"""A job that runs its own training script (spec.container) end to end on the local cluster: the example's
plain PyTorch loop (examples/own-code/train_loop.py, delivered by a ConfigMap through spec.podTemplate) is
profiled by model, planned, run by torchrun with memfit's plan in its environment (DDP), or with the DeepSpeed
config memfit writes beside it, and Succeeds; the settings it reports are the plan's. A training pod of the
loop killed mid-run is replaced, and the script resumes from its own checkpoint in MEMFIT_CHECKPOINT_DIR."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from memfit_testbed.own_code_cases import LOOP, LOOP_PINS
from memfit_testbed.pod_runner import descendants, signal_tree
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 420.0
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "own-code" / "train_loop.py"
PROBE_LOOP = Path(__file__).resolve().parents[2] / "tests" / "trainer" / "probe_loop.py"  # misbehaves on request
WORKSPACE = {
    "volumes": [{"name": "workspace", "configMap": {"name": "own-loop"}}],
    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace", "readOnly": True}],
    "env": [{"name": "MEMFIT_DEVICE", "value": "cpu"}],  # this machine has no GPU: DeepSpeed's CPU config
}


@pytest.fixture(scope="module")
def operator(cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[tuple[Path, int]]:
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, port):
        yield log, port


def _create(kube: Kube, namespace: str, name: str, container: dict[str, Any],
            strategy: dict[str, Any] | None = None, **spec: Any) -> None:
    scripts = {"train_loop.py": SCRIPT.read_text(), "probe_loop.py": PROBE_LOOP.read_text()}
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "own-loop"}, "data": scripts})
    create_job(kube, namespace, quickstart(name, container=container, podTemplate=WORKSPACE,
                                           strategy={**LOOP_PINS, **(strategy or {})}, **spec))


def _run(kube: Kube, namespace: str, log: Path, name: str, container: dict[str, Any],
         strategy: dict[str, Any] | None = None) -> tuple[dict, list[dict]]:
    _create(kube, namespace, name, container, strategy)
    job = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), TIMEOUT, log)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    pods = kube.pods(namespace, f"memfit.dev/job={name},memfit.dev/component=trainer")
    return job, pods


def _reported(pods: list[dict]) -> dict[str, Any]:
    """What the script said it ran with (rank 0 writes it as its termination message)."""
    messages = [c["state"]["terminated"].get("message") for p in pods for c in p["status"]["containerStatuses"]]
    return json.loads(next(m for m in messages if m))


def test_a_plain_torchrun_loop_runs_memfits_plan_and_succeeds(
    kube: Kube, namespace: str, operator: tuple[Path, int]
) -> None:
    job, pods = _run(kube, namespace, operator[0], "own-loop", LOOP)
    plan = job["status"]["plan"]
    assert plan["engine"] == "ddp" and plan["activationCheckpointing"] == "none" and not plan["optimizer8bit"]
    reported = _reported(pods)
    assert reported["engine"] == "ddp" and reported["steps"] == 20
    assert reported["micro_batch"] == plan["microBatchSize"]
    assert reported["accumulation"] == plan["gradientAccumulationSteps"]
    assert reported["precision"] == plan["precision"]
    assert reported["world"] == plan["gpus"]
    assert reported["micro_batch"] * reported["accumulation"] * reported["world"] == 8  # the global batch
    for pod in pods:
        trainer = pod["spec"]["containers"][0]
        assert trainer["name"] == "trainer" and trainer["args"][-len(LOOP["command"]):] == LOOP["command"]
        assert trainer["command"] == ["python3", "/memfit/probe/memfit_probe.py"] and trainer["args"][0] == "monitor"
    # Under the probe's monitor: the script's own message keeps its keys, memfit's peaks beside them, and the
    # steps the pod ran are the job's progress.
    assert reported["reason"] == "Completed" and reported["peakBytes"] > 0 and reported["memoryMeter"]
    progress = job["status"]["progress"]
    assert reported["steps"] == 20 and progress["step"] == 20 and progress["loss"] > 0, progress  # report_loss
    # The profiling pod ran memfit's profiler, then the script itself under the probe at micro-batches 1 and 2.
    [profiling] = kube.pods(namespace, "memfit.dev/job=own-loop,memfit.dev/component=profiler")
    ended = {s["name"]: s["state"]["terminated"] for s in (profiling["status"]["initContainerStatuses"]
                                                         + profiling["status"]["containerStatuses"])}
    assert [ended[n]["exitCode"] for n in ("memfit-probe", "profiler", "probe")] == [0, 0, 0]
    probe = json.loads(ended["probe"]["message"])
    assert probe["findings"] == [] and [p["fedMicroBatch"] for p in probe["points"]] == [1, 2]
    cache = kube.core.read_namespaced_config_map(job["status"]["profile"]["configMap"], namespace).data
    learned = {o["job"]: o for o in json.loads(cache["observations.json"])}
    one, two = learned["own-loop/probe/1"], learned["own-loop/probe/2"]
    assert one["device"] == "cpu" and 0 < one["measuredPeakBytes"] < two["measuredPeakBytes"]
    precision = next(e["value"] for e in profiling["spec"]["containers"][0]["env"] if e["name"] == "MEMFIT_PRECISION")
    no_bf16 = profiling["metadata"]["labels"]["memfit.dev/pool"] == "t4-spot"  # a T4 has no bf16: fp16
    assert precision == ("fp16" if no_bf16 else "bf16")
    assert one["configKey"] == f"ddp/0/{precision}/none/none/0/1/1/1/1"
    profiled = next(c for c in job["status"]["conditions"] if c["type"] == "Profiled")
    assert f"spec.container probed (DDP {precision}, one process, CPU allocator) at micro-batch 1: " in profiled["message"]


def test_a_script_that_ignores_the_planned_micro_batch_fails_profiling_naming_it(
    kube: Kube, namespace: str, operator: tuple[Path, int]
) -> None:
    name = "own-ignores"
    container = {**LOOP, "command": ["python3", "/workspace/probe_loop.py", "--mode", "ignores"]}
    _create(kube, namespace, name, container)
    job = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), TIMEOUT, operator[0])
    assert job["status"]["phase"] == "Failed"
    failed = next(c for c in job["status"]["conditions"] if c["reason"] == "ProfilingFailed")
    assert failed["message"] == ("spec.container under memfit's probe: the script ran micro-batch 8 where memfit "
                                 "planned 1: it does not honor microBatchSize")
    assert len(kube.pods(namespace, f"memfit.dev/job={name},memfit.dev/component=profiler")) == 1  # not rerun
    assert kube.pods(namespace, f"memfit.dev/job={name},memfit.dev/component=trainer") == []


def test_a_script_taking_memfits_deepspeed_config_runs_deepspeed_and_succeeds(
    kube: Kube, namespace: str, operator: tuple[Path, int]
) -> None:
    container = {**LOOP, "honors": ["deepspeedConfig"]}
    # fp32 pinned: the profiling pool is the simulated T4 (no bf16), where the probe runs fp16, and DeepSpeed
    # refuses fp16 on a CPU ("Type fp16 is not supported on your device"); a real T4 runs it.
    job, pods = _run(kube, namespace, operator[0], "own-ds", container, strategy={"precision": "fp32"})
    plan = job["status"]["plan"]
    assert plan["engine"] == "deepspeed"
    reported = _reported(pods)
    assert reported["engine"] == "deepspeed"
    assert (reported["micro_batch"], reported["accumulation"]) == (plan["microBatchSize"],
                                                                   plan["gradientAccumulationSteps"])
    statuses = {s["name"]: s for p in pods for s in p["status"]["initContainerStatuses"]}
    assert statuses["memfit-config"]["state"]["terminated"]["exitCode"] == 0
    # Probed under DeepSpeed too: the loop takes its micro-batch from the config, which the probe rewrote per run.
    [profiling] = kube.pods(namespace, "memfit.dev/job=own-ds,memfit.dev/component=profiler")
    assert [c["name"] for c in profiling["spec"]["initContainers"]] == ["memfit-probe", "memfit-config", "profiler"]
    probe = json.loads(profiling["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert probe["findings"] == [] and [p["fedMicroBatch"] for p in probe["points"]] == [1, 2]
    cache = kube.core.read_namespaced_config_map(job["status"]["profile"]["configMap"], namespace).data
    keys = {o["configKey"] for o in json.loads(cache["observations.json"]) if o["job"].startswith("own-ds/probe/")}
    assert keys and all(k.startswith("deepspeed/0/") for k in keys), keys


def test_a_killed_pod_of_a_plain_loop_resumes_from_the_scripts_own_checkpoint(
    cluster: Any, kube: Kube, namespace: str, operator: tuple[Path, int]
) -> None:
    # The kill follows the first checkpoint (a thirtieth of the steps) by about a poll and a read: mid-run
    # at 1 ms a step as at 15 ms (this machine's range for the tiny model in fp32), under a minute to finish.
    # fp32 is pinned: the planner's fp16 runs under CPU autocast at six times the step time (4 min a run).
    name, steps, every = "own-resume", 1500, 50
    training = {"globalBatchSize": 8, "maxSteps": steps, "optimizer": "adamw", "learningRate": 0.001}
    one_node = {"maxNodes": 1, "baseline": {"nodePool": "a100-80", "nodes": 1}}  # one pod: killed, replaced
    # Not probed (spec.container.probe: false): this test is about the training pod; the others probe.
    _create(kube, namespace, name, {**LOOP, "args": ["--save-every", str(every)], "probe": False},
            strategy={"precision": "fp32"}, training=training, placement=one_node)
    claim = cluster.workdir / "pod-runner" / "claims" / namespace / f"{name}-checkpoints"
    saved = kube.wait("the script's first checkpoint on the job's claim",
                      lambda: sorted(claim.rglob("step-*.pt")), timeout=TIMEOUT, interval=0.1)
    victim = kube.wait("a running trainer", lambda: _running(kube, namespace, name), timeout=60, interval=0.1)
    pid = int(victim["status"]["containerStatuses"][0]["containerID"].removeprefix("memfit-local://"))
    signal_tree(pid, descendants(pid), signal.SIGKILL)  # torchrun and its worker: a kernel kill of the container
    job = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), TIMEOUT, operator[0])
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert [a["outcome"] for a in job["status"]["attempts"]] == ["Succeeded"]  # a lost pod is no re-plan
    pods = kube.pods(namespace, f"memfit.dev/job={name},memfit.dev/component=trainer")
    ended = [p["status"]["containerStatuses"][0]["state"]["terminated"] for p in pods]
    assert sorted(t["exitCode"] for t in ended) == [0, 137], ended
    reported = json.loads(next(t["message"] for t in ended if t["exitCode"] == 0))
    first = int(saved[0].stem.split("-")[1])
    assert reported["steps"] == steps and first <= reported["resumed_from"] < steps, (reported, saved)
    assert reported["resumed_from"] % every == 0, reported  # a whole checkpoint, never a half-written one


def test_a_script_whose_first_steps_measure_over_the_plan_is_replanned_before_an_oom(
    kube: Kube, namespace: str, operator: tuple[Path, int]
) -> None:
    # The monitor multiplies the script's measured CPU peak by 200 in the first attempt (the operator's
    # injection annotation, as for its own trainer): over the plan after step 1, the pod exits MemoryOverPlan.
    name = "own-overplan"
    scripts = {"train_loop.py": SCRIPT.read_text(), "probe_loop.py": PROBE_LOOP.read_text()}
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "own-loop"}, "data": scripts})
    doc = quickstart(name, container=LOOP, podTemplate=WORKSPACE, strategy=LOOP_PINS)
    doc["metadata"]["annotations"] = {"memfit.dev/inject-peak-factor": "200"}
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), TIMEOUT, operator[0])
    attempts = job["status"]["attempts"]
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert [a["outcome"] for a in attempts] == ["MemoryOverPlan", "Succeeded"], attempts
    first, second = attempts
    assert first["reason"].startswith("first-steps peak ") and first["measuredPeakBytes"] > first["predictedPeakBytes"]
    assert second["predictedPeakBytes"] > first["predictedPeakBytes"], attempts  # learned from the measured peak


def _running(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    for pod in kube.pods(namespace, f"memfit.dev/job={name},memfit.dev/component=trainer"):
        statuses = pod["status"].get("containerStatuses") or []
        if pod["status"].get("phase") == "Running" and statuses and "running" in statuses[0]["state"]:
            return pod
    return None

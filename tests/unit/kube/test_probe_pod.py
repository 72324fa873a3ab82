"""The profiling pod of a job with its own container: memfit's profiler first (an init container), then the
user's image and command under memfit's probe on the same GPU, the probe's files copied in by memfit's
trainer image, the command's `$(NAME)` left for the probe to expand per run (memfit.kube.probe_pod)."""

from __future__ import annotations

from typing import Any

from factories import OWNER, PLACEMENT, POD
from memfit.api.common import Engine, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.plan import Plan
from memfit.catalog import CATALOG
from memfit.kube.common import DeviceRequest, Placement
from memfit.kube.profile_job import build_profile_input, build_profile_job
from memfit.lifecycle.probe_points import not_probed, probe_run, script_key
from memfit_testbed.own_code_cases import LOOP, job_spec

A100 = CATALOG.find("a100-80")
T4 = CATALOG.find("t4")


def _spec(container: dict[str, Any], **strategy: Any) -> MemoryOptimizedTrainingJobSpec:
    return MemoryOptimizedTrainingJobSpec.model_validate(job_spec(container, **strategy))


def _pod(spec: MemoryOptimizedTrainingJobSpec, placement: Placement = PLACEMENT) -> dict[str, Any]:
    job = build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=placement, pod=POD, timeout_seconds=600,
                            probe=probe_run(spec, A100))  # fmt: skip
    return job["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_profiler_runs_first_then_the_users_command_under_the_probe_on_the_same_gpu() -> None:
    own = {**LOOP, "args": ["--batch=$(MEMFIT_MICRO_BATCH_SIZE)"], "workingDir": "/workspace",
           "env": [{"name": "WANDB_MODE", "value": "offline"}]}
    pod = _pod(_spec(own))
    copier, profiler = pod["initContainers"]
    [probe] = pod["containers"]
    assert copier["name"] == "memfit-probe" and copier["image"] == POD.image
    assert copier["command"] == ["memfit-trainer", "probe-bundle", "--to", "/memfit/probe"]
    assert profiler["name"] == "profiler" and profiler["command"] == ["memfit-trainer", "profile"]
    assert profiler["terminationMessagePolicy"] == "File"  # its Profile, read from the init container status
    assert probe["name"] == "probe" and probe["image"] == LOOP["image"] and probe["workingDir"] == "/workspace"
    assert probe["command"] == ["python3", "/memfit/probe/memfit_probe.py"]
    separator = probe["args"].index("--")
    assert probe["args"][separator + 1:] == ["torchrun", "/workspace/train_loop.py", "--batch=$$(MEMFIT_MICRO_BATCH_SIZE)"]
    options = probe["args"][:separator]
    assert options[options.index("--micro-batches") + 1] == "1,2" and "--expand-variables" in options
    assert "--report-only" in options
    # The pod's work ends 60 s before the Job's 600-s deadline, counted from the bundle copier's start.
    assert options[options.index("--budget") + 1] == "540" == options[options.index("--timeout") + 1]
    assert options[options.index("--started-at") + 1] == "/memfit/probe/started-at"
    for gpu in (profiler, probe):
        assert gpu["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    env = _env(probe)
    assert env["MEMFIT_PRECISION"] == "bf16" and env["MEMFIT_ACTIVATION_CHECKPOINTING"] == "none"
    assert env["MEMFIT_OPTIMIZER_8BIT"] == "false" and env["MEMFIT_ZERO_STAGE"] == "0"
    assert env["PET_NNODES"] == "1" and env["PET_NPROC_PER_NODE"] == "1"
    assert env["MEMFIT_CHECKPOINT_DIR"].startswith("/tmp/")  # never the job's own checkpoints
    assert [e["name"] for e in probe["env"]][-1] == "WANDB_MODE"
    mounts = {m["mountPath"]: m for m in probe["volumeMounts"]}
    assert mounts["/memfit/probe"]["readOnly"] and "/tmp" in mounts
    assert {"name": "memfit-probe", "emptyDir": {}} in pod["volumes"]


def test_the_probed_configuration_is_what_the_job_pins_else_bf16_where_the_gpu_has_it() -> None:
    t4 = dict(probe_run(_spec(LOOP), T4).env)  # type: ignore[union-attr]
    assert t4["MEMFIT_PRECISION"] == "fp16"  # no bf16 on a T4
    pinned = dict(probe_run(_spec(LOOP, precision="fp32"), A100).env)  # type: ignore[union-attr]
    assert pinned["MEMFIT_PRECISION"] == "fp32"
    run = probe_run(_spec({**LOOP, "honors": ["gradientAccumulation", "precision"]}, microBatchSize=4), A100)
    assert run is not None and run.micro_batches == (4,)  # a script that runs its own micro-batch


def test_a_dra_pool_gives_the_profiler_and_the_probe_the_one_claimed_device() -> None:
    dra = Placement(pool="h100-dra", node_selector={}, dra=DeviceRequest("gpu.nvidia.com", "gpu.nvidia.com", None))
    pod = _pod(_spec(LOOP), dra)
    profiler, probe = pod["initContainers"][1], pod["containers"][0]
    assert profiler["resources"]["claims"] == probe["resources"]["claims"] == [{"name": "gpus"}]
    assert "limits" not in probe["resources"]


def test_what_is_not_probed_says_why_and_runs_the_profiler_alone() -> None:
    assert not_probed(_spec({**LOOP, "probe": False})) == "spec.container.probe is false"
    assert "command is not set" in not_probed(_spec({k: v for k, v in LOOP.items() if k != "command"}))
    pod = _pod(_spec({**LOOP, "probe": False}))
    assert [c["name"] for c in pod["containers"]] == ["profiler"] and "initContainers" not in pod


def test_the_script_is_part_of_the_profile_cache_key() -> None:
    base = script_key(_spec(LOOP))
    assert base and base != script_key(_spec({**LOOP, "args": ["--layers", "4"]}))
    assert base != script_key(_spec({**LOOP, "image": "team/train:2"}))
    assert script_key(_spec({**LOOP, "probe": False})) == ""


def test_a_script_taking_the_deepspeed_config_gets_the_probed_configurations_config() -> None:
    spec = _spec({**LOOP, "honors": ["deepspeedConfig"]})
    assert not_probed(spec) == ""
    run = probe_run(spec, A100)
    assert run is not None and run.deepspeed
    pod = _pod(spec)
    names = [c["name"] for c in pod["initContainers"]]
    assert names == ["memfit-probe", "memfit-config", "profiler"]
    writer = pod["initContainers"][1]
    assert writer["command"][-2:] == ["/etc/memfit/probe-plan.json", "/memfit/config/deepspeed.json"]
    assert {"name": "problem", "mountPath": "/etc/memfit", "readOnly": True} in writer["volumeMounts"]
    probe = pod["containers"][0]
    assert _env(probe)["MEMFIT_DEEPSPEED_CONFIG"] == "/memfit/config/deepspeed.json"
    assert {"name": "memfit-config", "mountPath": "/memfit/config", "readOnly": True} in probe["volumeMounts"]
    plan = Plan.model_validate_json(run.plan_json)
    assert (plan.engine, plan.zero_stage, plan.precision, plan.nodes, plan.gpus_per_node) == (
        Engine.DEEPSPEED, 0, Precision.BF16, 1, 1)
    data = build_profile_input(owner=OWNER, problem=spec.problem, problem_hash="ab" * 32, probe=run)["data"]
    assert data["probe-plan.json"] == run.plan_json

"""The training pod of a job with its own container: the user's image and command in the trainer's place,
memfit's plan in its environment, the DeepSpeed config written beside it when the script takes one."""

from __future__ import annotations

from typing import Any

from factories import OWNER, PLACEMENT, POD, make_plan
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.kube.train_job import build_training_job
from memfit_testbed.own_code_cases import LOOP, job_spec


def _pod(container: dict[str, Any], **strategy: Any) -> dict[str, Any]:
    spec = MemoryOptimizedTrainingJobSpec.model_validate(job_spec(container, **strategy))
    plan = make_plan(micro_batch_size=2, gradient_accumulation_steps=4, nodes=2, gpus_per_node=4)
    job = build_training_job(owner=OWNER, spec=spec, plan=plan, placement=PLACEMENT, pod=POD)
    return job["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_users_container_takes_the_trainers_place_with_the_plan_in_its_environment() -> None:
    own = {**LOOP, "args": ["--batch=$(MEMFIT_MICRO_BATCH_SIZE)"], "workingDir": "/workspace",
           "env": [{"name": "WANDB_MODE", "value": "offline"}]}
    pod = _pod({**own, "probe": False})
    [trainer] = pod["containers"]
    assert trainer["name"] == "trainer" and trainer["image"] == LOOP["image"]
    assert trainer["command"] == LOOP["command"] and trainer["args"] == own["args"]
    assert trainer["workingDir"] == "/workspace"
    env = _env(trainer)
    assert env["MEMFIT_MICRO_BATCH_SIZE"] == "2" and env["MEMFIT_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert env["MEMFIT_PRECISION"] == "bf16" and env["MEMFIT_ZERO_STAGE"] == "2"
    assert env["MEMFIT_ACTIVATION_CHECKPOINTING"] == "full" and env["MEMFIT_OPTIMIZER_8BIT"] == "true"
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "4"  # torchrun reads these
    assert env["MEMFIT_CHECKPOINT_DIR"] == "/checkpoints/llama" and env["WANDB_MODE"] == "offline"
    assert [e["name"] for e in trainer["env"]][-1] == "WANDB_MODE"  # may refer to memfit's with $(NAME)
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "MEMFIT_DEEPSPEED_CONFIG" not in env and "initContainers" not in pod


def test_a_script_taking_the_deepspeed_config_finds_it_written_by_memfits_image() -> None:
    pod = _pod({**LOOP, "honors": ["deepspeedConfig"]})
    writer, _ = pod["initContainers"]
    assert writer["name"] == "memfit-config" and writer["image"] == POD.image
    assert writer["command"][:2] == ["sh", "-c"] and "memfit-trainer deepspeed-config" in writer["command"][2]
    assert writer["command"][3:] == ["/etc/memfit/plan.json", "/memfit/config/deepspeed.json"]
    trainer = pod["containers"][0]
    assert _env(trainer)["MEMFIT_DEEPSPEED_CONFIG"] == "/memfit/config/deepspeed.json"
    assert {"name": "memfit-config", "mountPath": "/memfit/config", "readOnly": True} in trainer["volumeMounts"]
    assert {"name": "memfit-config", "emptyDir": {}} in pod["volumes"]
    assert writer["securityContext"] == trainer["securityContext"]


def test_the_config_writer_runs_like_the_trainer_read_only_root_writable_tmp_same_variables() -> None:
    """Under a read-only root (the trainer's security context) Python and torch write their caches to /tmp
    on import; without the trainer's /tmp the writer exited 1 on a real kubelet. It also reads
    MEMFIT_DEVICE from the trainer's variables (spec.podTemplate.env) to write a CPU config."""
    pod = _pod({**LOOP, "honors": ["deepspeedConfig"]})
    writer, _ = pod["initContainers"]
    volumes = {v["name"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in writer["volumeMounts"]}
    assert writer["securityContext"]["readOnlyRootFilesystem"] is True
    assert mounts["/tmp"] == "tmp" and set(mounts.values()) <= volumes
    assert writer["env"] and all(e in pod["containers"][0]["env"] for e in writer["env"])


def test_the_script_runs_under_the_probe_monitor_from_a_bundle_memfits_image_copies() -> None:
    """spec.container.probe (the default) with a command: the command and args are the monitor's, after `--`,
    unescaped (the kubelet expands $(NAME) once: the pod has one plan); the bundle comes from memfit's image."""
    own = {**LOOP, "args": ["--batch=$(MEMFIT_MICRO_BATCH_SIZE)"]}
    pod = _pod(own)
    [copier] = pod["initContainers"]
    assert copier["name"] == "memfit-probe" and copier["image"] == POD.image
    assert copier["command"] == ["memfit-trainer", "probe-bundle", "--to", "/memfit/probe"]
    [trainer] = pod["containers"]
    assert trainer["image"] == LOOP["image"]
    assert trainer["command"] == ["python3", "/memfit/probe/memfit_probe.py"]
    assert trainer["args"] == ["monitor", "--termination-log", "/dev/termination-log", "--", *LOOP["command"],
                               "--batch=$(MEMFIT_MICRO_BATCH_SIZE)"]
    assert {"name": "memfit-probe", "mountPath": "/memfit/probe", "readOnly": True} in trainer["volumeMounts"]
    assert {"name": "memfit-probe", "emptyDir": {}} in pod["volumes"]
    assert _env(trainer)["MEMFIT_METRICS_PORT"] == "9400" and _env(trainer)["MEMFIT_PLAN_PATH"]
    assert trainer["terminationMessagePath"] == "/dev/termination-log"
    # Without a command the image's entrypoint is unknown to memfit: it runs as it is.
    bare = _pod({k: v for k, v in LOOP.items() if k != "command"})
    assert "initContainers" not in bare and "command" not in bare["containers"][0]

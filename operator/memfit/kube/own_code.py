"""A training pod that runs the user's own container (`spec.container`) instead of memfit's trainer.

The container keeps the trainer's place (its name, ports, resources, mounts, security context and the
termination-message file), so the Job's failure policy, the checkpoint volume and Kueue see the same pod;
only its image, command, arguments, working directory and environment are the user's. memfit's plan
reaches the script as variables (`MEMFIT_MICRO_BATCH_SIZE`, ...) and, for a script that takes one, as a
DeepSpeed config written next to it by an init container of memfit's trainer image
(`memfit-trainer deepspeed-config`, the one mapping from a Plan to DeepSpeed's keys).

With `spec.container.probe` (the default) and a `command`, the command runs under memfit's probe in monitor
mode (`python3 /memfit/probe/memfit_probe.py monitor -- COMMAND ARGS`, memfit_trainer.probe.monitor), its
Python files copied into an emptyDir by an init container of memfit's trainer image: the pod serves the
script's progress where the operator reads the trainer's, stops a script whose first steps measure more than
the plan allows with MemoryOverPlan, and reports the measured peaks when it completes.
"""

from __future__ import annotations

from memfit.api import pod as contract
from memfit.api.own_code import Knob, OwnContainer
from memfit.api.plan import Plan
from memfit.api.termination import DEFAULT_TERMINATION_MESSAGE_PATH
from memfit.api.training_config import TrainingConfig
from memfit.kube.common import Manifest, PodSettings, container_security_context

CONFIG_VOLUME = "memfit-config"
DEEPSPEED_PATH = f"{contract.CONFIG_MOUNT}/{contract.DEEPSPEED_FILE}"
PROBE_VOLUME = "memfit-probe"
PROBE_LAUNCHER_PATH = f"{contract.PROBE_MOUNT}/{contract.PROBE_LAUNCHER}"


def monitored(own: OwnContainer) -> bool:
    """Whether the training pod runs the command under memfit's probe (it wraps the command: an image's
    entrypoint without one is unknown to memfit)."""
    return own.probe and bool(own.command)


def bundle_copier(pod: PodSettings) -> Manifest:
    """The init container that copies the probe's Python files (memfit's trainer image) for the user's image."""
    return {
        "name": contract.PROBE_BUNDLE_CONTAINER,
        "image": pod.image,
        "imagePullPolicy": pod.image_pull_policy,
        "command": ["memfit-trainer", "probe-bundle", "--to", contract.PROBE_MOUNT],
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": PROBE_VOLUME, "mountPath": contract.PROBE_MOUNT},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }


def plan_env(plan: Plan) -> list[Manifest]:
    """The plan's knobs as variables: what a script applies (the global batch = micro x accumulation x
    data-parallel ranks stays training.globalBatchSize)."""
    config: TrainingConfig = plan
    values = {
        contract.ENV_MICRO_BATCH_SIZE: str(config.micro_batch_size),
        contract.ENV_GRADIENT_ACCUMULATION_STEPS: str(config.gradient_accumulation_steps),
        contract.ENV_PRECISION: config.precision.value,
        contract.ENV_ZERO_STAGE: str(config.zero_stage),
        contract.ENV_ACTIVATION_CHECKPOINTING: config.activation_checkpointing.value,
        contract.ENV_OPTIMIZER_8BIT: "true" if config.optimizer8bit else "false",
    }
    if plan.training is not None:
        values[contract.ENV_GLOBAL_BATCH_SIZE] = str(plan.training.global_batch_size)
        values[contract.ENV_MAX_STEPS] = str(plan.training.max_steps)
        values[contract.ENV_LEARNING_RATE] = repr(plan.training.learning_rate)
    return [{"name": name, "value": value} for name, value in values.items()]


def own_container(trainer: Manifest, own: OwnContainer, plan: Plan) -> Manifest:
    """memfit's trainer container turned into the user's: same place in the pod, the user's process."""
    out = {k: v for k, v in trainer.items() if k not in ("command", "args", "workingDir")}
    out["image"] = own.image
    if monitored(own):  # the kubelet still expands $(NAME) in the user's part, once: the pod has one plan
        out["command"] = ["python3", PROBE_LAUNCHER_PATH]
        out["args"] = ["monitor", "--termination-log", DEFAULT_TERMINATION_MESSAGE_PATH, "--", *(own.command or ()), *(own.args or ())]
    else:
        if own.command:
            out["command"] = list(own.command)
        if own.args:
            out["args"] = list(own.args)
    if own.working_dir:
        out["workingDir"] = own.working_dir
    env = list(trainer.get("env", [])) + plan_env(plan)
    mounts = list(trainer.get("volumeMounts", []))
    if Knob.DEEPSPEED_CONFIG in own.honors:
        env.append({"name": contract.ENV_DEEPSPEED_CONFIG, "value": DEEPSPEED_PATH})
        mounts.append({"name": CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT, "readOnly": True})
    if monitored(own):
        mounts.append({"name": PROBE_VOLUME, "mountPath": contract.PROBE_MOUNT, "readOnly": True})
    out["volumeMounts"] = mounts
    # The user's own variables last: they may refer to memfit's with $(NAME).
    out["env"] = env + [e.to_wire() for e in own.env or []]
    # A script that dies writes no termination message: its last log lines stand in for one.
    out["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return out


# The config for GPUs (pinned host memory, overlapped communication, fused optimizers), or for CPUs when the
# pod says MEMFIT_DEVICE=cpu (a CPU test cluster: spec.podTemplate.env).
WRITE_CONFIG = ('if [ "$MEMFIT_DEVICE" = cpu ]; then device=--no-cuda; else device=--cuda; fi; '
                'memfit-trainer deepspeed-config --plan "$0" "$device" > "$1"')


def config_writer(pod: PodSettings, *, plan_path: str, env: list[Manifest], plan_volume: str = "plan") -> Manifest:
    """The init container that writes the plan's DeepSpeed config where the user's container reads it.

    It runs memfit's trainer image under the trainer's security context (read-only root), so it gets the
    trainer's writable /tmp (Python and torch write there on import) and the trainer's variables
    (MEMFIT_DEVICE from spec.podTemplate.env picks the CPU config). `plan_volume`: the volume holding the plan at
    memfit's plan mount (the profiling pod's is the problem ConfigMap, with the probe's plan)."""
    return {
        "name": contract.CONFIG_CONTAINER,
        "image": pod.image,
        "imagePullPolicy": pod.image_pull_policy,
        "command": ["sh", "-c", WRITE_CONFIG, plan_path, DEEPSPEED_PATH],
        "env": list(env),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": plan_volume, "mountPath": contract.PLAN_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT},
        ],
    }


def apply_own_container(pod_spec: Manifest, own: OwnContainer | None, plan: Plan, pod: PodSettings, *,
                        plan_path: str) -> None:
    """Replace memfit's trainer in `pod_spec` by the user's container (in place); nothing without one."""
    if own is None:
        return
    containers = pod_spec["containers"]
    trainer_env = list(containers[0].get("env", []))
    containers[0] = own_container(containers[0], own, plan)
    if Knob.DEEPSPEED_CONFIG in own.honors:
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), {"name": CONFIG_VOLUME, "emptyDir": {}}]
        pod_spec["initContainers"] = [*pod_spec.get("initContainers", []),
                                      config_writer(pod, plan_path=plan_path, env=trainer_env)]
    if monitored(own):
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), {"name": PROBE_VOLUME, "emptyDir": {}}]
        pod_spec["initContainers"] = [*pod_spec.get("initContainers", []), bundle_copier(pod)]

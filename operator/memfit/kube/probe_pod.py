"""The profiling pod of a job that runs its own container (`spec.container`) and lets memfit probe it.

memfit's profiler still measures `spec.problem` first (the model's shape and every configuration's terms),
as an init container; then the pod's one container is the user's own image and command, run under memfit's
probe (memfit_trainer.probe) at a few micro-batches: it measures the script's own step peaks, which
calibrate the plan. The probe reaches the user's image as plain Python files (`memfit-trainer probe-bundle`,
an init container of memfit's trainer image, into an emptyDir), so the image needs only python3 and torch.

The user's command and arguments are passed with every `$` doubled: the kubelet turns `$$(NAME)` back into
`$(NAME)`, and the probe expands it per run (memfit_trainer.probe.expansion), so a script's
`--batch=$(MEMFIT_MICRO_BATCH_SIZE)` gets each probed micro-batch, not the container's one value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memfit.api import pod as contract
from memfit.api.own_code import Knob, OwnContainer
from memfit.kube.common import Manifest, PodSettings, container_security_context
from memfit.kube.own_code import CONFIG_VOLUME, DEEPSPEED_PATH, PROBE_VOLUME, bundle_copier, config_writer

PROBE_SUMMARY = "/tmp/memfit-probe.json"
PROBE_PLAN_FILE = "probe-plan.json"  # in the profiling pod's problem ConfigMap: the probed configuration as a Plan


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """What the probe runs: the user's container, the variables of the probed configuration, the micro-batches,
    the optimizer steps measured at each and the seconds the pod's work may take, counted from its first
    container (the profiler's time included): a run still going then is killed as hung, before the Job's
    deadline ends the pod."""

    own: OwnContainer
    env: tuple[tuple[str, str], ...]
    micro_batches: tuple[int, ...]
    steps: int
    budget_seconds: int
    plan_json: str = ""  # the probed configuration as a Plan, for a script that takes memfit's DeepSpeed config

    @property
    def deepspeed(self) -> bool:
        return Knob.DEEPSPEED_CONFIG in self.own.honors


def _escaped(parts: Sequence[str] | None) -> list[str]:
    return [part.replace("$", "$$") for part in parts or ()]


def probe_container(profiler: Manifest, run: ProbeRun) -> Manifest:
    """The user's image and command under the probe, in the profiler's place: its GPU, /tmp and security
    context; the probed configuration's variables, then the user's own."""
    own = run.own
    args = ["--micro-batches", ",".join(str(b) for b in run.micro_batches), "--steps", str(run.steps),
            "--timeout", str(run.budget_seconds), "--budget", str(run.budget_seconds),
            "--started-at", f"{contract.PROBE_MOUNT}/{contract.PROBE_STARTED_AT}", "--out", PROBE_SUMMARY,
            "--termination-log", "/dev/termination-log", "--expand-variables", "--report-only",
            "--", *_escaped(own.command), *_escaped(own.args)]  # fmt: skip
    env = [e for e in profiler.get("env", []) if e.get("name") == contract.ENV_JOB]
    env += [{"name": name, "value": value} for name, value in run.env]
    mounts = [{"name": "tmp", "mountPath": "/tmp"},
              {"name": PROBE_VOLUME, "mountPath": contract.PROBE_MOUNT, "readOnly": True}]
    if run.deepspeed:  # the probe gives each run its copy at that micro-batch (memfit_trainer.probe.driver)
        env.append({"name": contract.ENV_DEEPSPEED_CONFIG, "value": DEEPSPEED_PATH})
        mounts.append({"name": CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT, "readOnly": True})
    container: Manifest = {
        "name": contract.PROBE_CONTAINER,
        "image": own.image,
        "imagePullPolicy": profiler.get("imagePullPolicy", "IfNotPresent"),
        "command": ["python3", f"{contract.PROBE_MOUNT}/{contract.PROBE_LAUNCHER}"],
        "args": args,
        "env": env + [e.to_wire() for e in own.env or []],
        "resources": dict(profiler.get("resources") or {}),
        "terminationMessagePath": "/dev/termination-log",
        # The probe writes its summary there; a probe that cannot start (no python3 in the image) leaves
        # its last log lines instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    if own.working_dir:
        container["workingDir"] = own.working_dir
    return container


def with_probe(pod_spec: Manifest, pod: PodSettings, run: ProbeRun) -> Manifest:
    """Turn the profiling pod (its one container, the profiler) into profiler-then-probe, in place: the
    bundle copier and the profiler become init containers, the probe the pod's container. Returns the probe."""
    (profiler,) = pod_spec["containers"]
    probe = probe_container(profiler, run)
    writers = []
    volumes = [{"name": PROBE_VOLUME, "emptyDir": {}}]
    if run.deepspeed:  # the DeepSpeed config of the probed configuration, by the mapping training pods use
        writers.append(config_writer(pod, plan_path=f"{contract.PLAN_MOUNT}/{PROBE_PLAN_FILE}",
                                     env=[e for e in profiler.get("env", []) if e.get("name") == contract.ENV_JOB],
                                     plan_volume="problem"))  # fmt: skip
        volumes.append({"name": CONFIG_VOLUME, "emptyDir": {}})
    pod_spec["initContainers"] = [*pod_spec.get("initContainers", []), bundle_copier(pod), *writers, profiler]
    pod_spec["containers"] = [probe]
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), *volumes]
    return probe

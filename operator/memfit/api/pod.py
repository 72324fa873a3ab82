"""The pod contract between the operator and the trainer: environment, mounts, ports and metric names.

The operator's builders (memfit.kube) write these into the profiling and training pods; the trainer
(memfit_trainer) reads them; the operator's progress reader (memfit.lifecycle.progress) reads the
trainer's metrics by these names. Like `api/termination.py` for the termination message, this module
is the one place either side spells them (Kubeflow Trainer keeps its pod contract in one `constants`
package for the same reason); tests/unit/api/test_pod_contract.py fails when a module spells one itself.
A user's own training script reads the same variables (docs/trainer.md).
"""

from __future__ import annotations

# --- mounts (paths inside the pods) ---------------------------------------------------------------
PLAN_MOUNT = "/etc/memfit"  # the plan ConfigMap (plan.json, deepspeed.json) / the profiler's problem.json
PLAN_FILE = "plan.json"
PROBLEM_FILE = "problem.json"
CHECKPOINT_MOUNT = "/checkpoints"
NVME_MOUNT = "/nvme"
OUTPUT_MOUNT = "/output"
# Model and dataset volumes, read-only, one folder per PersistentVolumeClaim: /memfit/volumes/<claim>.
VOLUMES_MOUNT = "/memfit/volumes"
HUB_CACHE = f"{CHECKPOINT_MOUNT}/.hub"  # HF_HOME of training pods: the hub cache shared by attempts
PROFILE_HUB_CACHE = "/tmp/hub"  # HF_HOME of the profiling pod (it downloads config.json only)

# --- ports ----------------------------------------------------------------------------------------
MASTER_PORT = 29500  # torch.distributed rendezvous
METRICS_PORT = 9400  # rank 0's Prometheus exporter; local rank r serves on METRICS_PORT + r

# --- environment the operator sets and the trainer reads -------------------------------------------
ENV_JOB = "MEMFIT_JOB"  # the MOTJ's name (metrics label, logs)
ENV_METRICS_PORT = "MEMFIT_METRICS_PORT"
ENV_PLAN_PATH = "MEMFIT_PLAN_PATH"
ENV_CHECKPOINT_DIR = "MEMFIT_CHECKPOINT_DIR"
ENV_OUTPUT_DIR = "MEMFIT_OUTPUT_DIR"
ENV_SAVE_MERGED = "MEMFIT_SAVE_MERGED"  # "1": save LoRA adapters merged into the base model
ENV_VOLUMES_DIR = "MEMFIT_VOLUMES_DIR"
ENV_FETCH_SHARED = "MEMFIT_FETCH_SHARED"  # "1": the hub cache is shared by the nodes (rank 0 fetches)
ENV_NODE_RANK = "MEMFIT_NODE_RANK"
ENV_TERMINATION_MESSAGE_PATH = "MEMFIT_TERMINATION_MESSAGE_PATH"  # overrides /dev/termination-log
# The plan's knobs for a user's own training container (spec.container; docs/own-code.md)
ENV_MICRO_BATCH_SIZE = "MEMFIT_MICRO_BATCH_SIZE"
ENV_GRADIENT_ACCUMULATION_STEPS = "MEMFIT_GRADIENT_ACCUMULATION_STEPS"
ENV_GLOBAL_BATCH_SIZE = "MEMFIT_GLOBAL_BATCH_SIZE"
ENV_PRECISION = "MEMFIT_PRECISION"  # fp32, bf16 or fp16
ENV_ZERO_STAGE = "MEMFIT_ZERO_STAGE"
ENV_ACTIVATION_CHECKPOINTING = "MEMFIT_ACTIVATION_CHECKPOINTING"  # none, selective or full
ENV_OPTIMIZER_8BIT = "MEMFIT_OPTIMIZER_8BIT"  # true or false
ENV_MAX_STEPS = "MEMFIT_MAX_STEPS"
ENV_LEARNING_RATE = "MEMFIT_LEARNING_RATE"
ENV_DEEPSPEED_CONFIG = "MEMFIT_DEEPSPEED_CONFIG"  # the DeepSpeed config's path (a script that takes one)
CONFIG_MOUNT = "/memfit/config"  # generated files for a user's container (the DeepSpeed config)
DEEPSPEED_FILE = "deepspeed.json"
# Fault injection (tests and chaos drills; docs/operator.md)
ENV_INJECT_OOM_AT_STEP = "MEMFIT_INJECT_OOM_AT_STEP"
ENV_INJECT_OOM_RANK = "MEMFIT_INJECT_OOM_RANK"
ENV_INJECT_PEAK_FACTOR = "MEMFIT_INJECT_PEAK_FACTOR"
ENV_INJECT_KILL_AT_STEP = "MEMFIT_INJECT_KILL_AT_STEP"
ENV_INJECT_KILL_RANK = "MEMFIT_INJECT_KILL_RANK"  # only this global rank is killed (default: every rank)
ENV_INJECT_HOLD_AT_STEP = "MEMFIT_INJECT_HOLD_AT_STEP"  # every rank stalls at this step until it is ended
# Set by a user or the test bed, read by the trainer (docs/trainer.md)
ENV_KEEP_CHECKPOINTS = "MEMFIT_KEEP_CHECKPOINTS"
ENV_SEED = "MEMFIT_SEED"
ENV_FIRST_STEPS = "MEMFIT_FIRST_STEPS"  # steps the first-steps memory check covers per attempt; 0 = off
ENV_DEVICE = "MEMFIT_DEVICE"  # cpu | cuda | simulated-cuda (the local pod runner)
ENV_CPU_MEMORY_METER = "MEMFIT_CPU_MEMORY_METER"
ENV_SIMULATED_GPU = "MEMFIT_SIMULATED_GPU"
# The probe that profiles a user's own script (memfit_trainer.probe): its driver sets these for the script's
# process, whose sitecustomize then installs the probe's hooks.
ENV_PROBE_OUT = "MEMFIT_PROBE_OUT"  # where the hooks write their JSON result (rank 0; other ranks beside it)
ENV_PROBE_STEPS = "MEMFIT_PROBE_STEPS"  # optimizer steps to measure before the probe ends the process
PROBE_MOUNT = "/memfit/probe"  # the probe's bundle in the profiling pod (memfit_trainer.probe.bundle)
PROBE_LAUNCHER = "memfit_probe.py"  # the bundle's entry: `python3 /memfit/probe/memfit_probe.py ARGS`
PROBE_STARTED_AT = "started-at"  # in the bundle: when the profiling pod's first container ran (epoch seconds)
# torchrun's own variables (torch.distributed.run reads PET_<flag>)
ENV_NNODES = "PET_NNODES"
ENV_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_TORCHRUN_NODE_RANK = "PET_NODE_RANK"
ENV_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_MASTER_PORT = "PET_MASTER_PORT"
# Hugging Face's own variables
ENV_HF_HOME = "HF_HOME"
ENV_HF_TOKEN = "HF_TOKEN"
ENV_HF_ENDPOINT = "HF_ENDPOINT"
ENV_HF_HUB_OFFLINE = "HF_HUB_OFFLINE"

# --- the trainer's metrics the operator reads (memfit_trainer.metrics serves them) ------------------
METRIC_STEP = "memfit_trainer_step"
METRIC_LOSS = "memfit_trainer_loss"
METRIC_EVAL_LOSS = "memfit_trainer_eval_loss"
METRIC_TOKENS_PER_SECOND = "memfit_trainer_tokens_per_second"
METRIC_STEP_SECONDS = "memfit_trainer_step_seconds"  # a Summary: _sum and _count
METRIC_STEP_SECONDS_SUM = f"{METRIC_STEP_SECONDS}_sum"
METRIC_STEP_SECONDS_COUNT = f"{METRIC_STEP_SECONDS}_count"
METRIC_RESUMED_FROM_STEP = "memfit_trainer_resumed_from_step"
PROGRESS_SERIES = (
    METRIC_STEP,
    METRIC_LOSS,
    METRIC_EVAL_LOSS,
    METRIC_TOKENS_PER_SECOND,
    METRIC_STEP_SECONDS_SUM,
    METRIC_STEP_SECONDS_COUNT,
    METRIC_RESUMED_FROM_STEP,
)

# --- what memfit owns in its pods (spec.podTemplate may add to a pod, never change these) -----------
TRAINER_CONTAINER = "trainer"
PROFILER_CONTAINER = "profiler"
FETCH_CONTAINER = "fetch-model"  # the download step's init container (memfit-trainer fetch)
CONFIG_CONTAINER = "memfit-config"  # writes the generated files of a user's container (the DeepSpeed config)
PROBE_CONTAINER = "probe"  # the profiling pod's run of a user's own container under the probe
PROBE_BUNDLE_CONTAINER = "memfit-probe"  # copies the probe's Python files for the user's image
OWNED_CONTAINERS = (TRAINER_CONTAINER, PROFILER_CONTAINER, FETCH_CONTAINER, CONFIG_CONTAINER, PROBE_CONTAINER,
                    PROBE_BUNDLE_CONTAINER)
# Volumes memfit declares (source-<n>: the model and data claims, one each)
OWNED_VOLUMES = ("plan", "problem", "shm", "tmp", "checkpoints", "output", "nvme", "model", "memfit-config",
                 "memfit-probe")
OWNED_VOLUME_PREFIX = "source-"
# Paths memfit mounts (a mount at one of them or inside one would shadow memfit's files)
OWNED_MOUNTS = (PLAN_MOUNT, CHECKPOINT_MOUNT, OUTPUT_MOUNT, NVME_MOUNT, "/memfit", "/dev/shm", "/tmp")
# Variables memfit sets on its containers (the user-settable MEMFIT_SEED, MEMFIT_KEEP_CHECKPOINTS,
# MEMFIT_FIRST_STEPS and the fault-injection ones are not owned: a template may set them).
OWNED_ENV = (
    ENV_JOB, ENV_METRICS_PORT, ENV_PLAN_PATH, ENV_CHECKPOINT_DIR, ENV_OUTPUT_DIR, ENV_SAVE_MERGED,
    ENV_VOLUMES_DIR, ENV_FETCH_SHARED, ENV_NODE_RANK, ENV_TERMINATION_MESSAGE_PATH,
    ENV_NNODES, ENV_NPROC_PER_NODE, ENV_TORCHRUN_NODE_RANK, ENV_MASTER_ADDR, ENV_MASTER_PORT,
    ENV_HF_HOME, ENV_HF_TOKEN, ENV_HF_ENDPOINT, ENV_HF_HUB_OFFLINE,
    ENV_MICRO_BATCH_SIZE, ENV_GRADIENT_ACCUMULATION_STEPS, ENV_GLOBAL_BATCH_SIZE, ENV_PRECISION, ENV_ZERO_STAGE,
    ENV_ACTIVATION_CHECKPOINTING, ENV_OPTIMIZER_8BIT, ENV_MAX_STEPS, ENV_LEARNING_RATE, ENV_DEEPSPEED_CONFIG,
)
# Label and annotation prefixes memfit, Kueue and the Job controller write on pods
OWNED_METADATA_PREFIXES = ("memfit.dev/", "kueue.x-k8s.io/", "batch.kubernetes.io/")
OWNED_METADATA_KEYS = ("job-name", "controller-uid")
# Extended resources memfit requests itself (the GPUs of the plan; MIG slices are nvidia.com/mig-*)
OWNED_RESOURCE_PREFIX = "nvidia.com/"

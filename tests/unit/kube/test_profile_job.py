"""The profiling Job: one GPU, a deadline, the problem mounted from its ConfigMap."""

from __future__ import annotations

import json

from factories import OWNER, PLACEMENT, POD, make_spec
from memfit.kube.profile_job import build_profile_input, build_profile_job


def test_profile_job_requests_one_gpu_with_deadline_and_backoff() -> None:
    job = build_profile_job(
        owner=OWNER, problem_hash="ab" * 32, placement=PLACEMENT, pod=POD, timeout_seconds=300
    )
    assert job["metadata"]["name"] == "llama-profile"
    assert job["spec"]["activeDeadlineSeconds"] == 300 and job["spec"]["backoffLimit"] == 1
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert container["command"] == ["memfit-trainer", "profile"]
    assert container["args"] == ["--problem", "/etc/memfit/problem.json", "--out", "/tmp/profile.json",
                                 "--optimizer", "adamw", "--optimizer8bit", "auto"]
    assert container["terminationMessagePolicy"] == "File"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert job["spec"]["template"]["metadata"]["labels"]["memfit.dev/component"] == "profiler"


def test_profile_input_holds_the_problem_json() -> None:
    spec = make_spec()
    cm = build_profile_input(owner=OWNER, problem=spec.problem, problem_hash="cd" * 32)
    assert json.loads(cm["data"]["problem.json"]) == spec.problem.to_wire()
    assert cm["metadata"]["labels"]["memfit.dev/problem-hash"] == "cd" * 8


def test_profile_job_runs_the_jobs_optimizer_and_8bit_choice() -> None:
    job = build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=PLACEMENT, pod=POD,
                            timeout_seconds=300, optimizer="sgd", optimizer8bit="disabled")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-4:] == ["--optimizer", "sgd", "--optimizer8bit", "off"]


def test_profile_job_checks_the_lora_targets_the_job_allows() -> None:
    job = build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=PLACEMENT, pod=POD,
                            timeout_seconds=300, lora_targets=("qkv", "fc"), lora_rank=8)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-4:] == ["--lora-targets", "qkv,fc", "--lora-rank", "8"]
    plain = build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=PLACEMENT, pod=POD, timeout_seconds=300)
    assert "--lora-targets" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]


def test_profile_job_measures_the_peft_variant_the_job_allows() -> None:
    job = build_profile_job(owner=OWNER, problem_hash="ab" * 32, placement=PLACEMENT, pod=POD, timeout_seconds=300,
                            lora_targets=("qkv",), lora_rank=8, peft_methods=("lora", "qlora"), qlora_double_quant=False)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--peft-methods") + 1] == "lora,qlora"
    assert args[args.index("--qlora-double-quant") + 1] == "off"


def _profile_pod(problem: dict, pod: object = POD) -> dict:
    hf = make_spec(problem=problem).problem.huggingface
    job = build_profile_job(owner=OWNER, problem_hash="h" * 64, placement=PLACEMENT, pod=pod, timeout_seconds=600,
                            model=hf)  # fmt: skip
    return job["spec"]["template"]["spec"]


def _pod_env(pod: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


def test_profile_pod_reads_a_volume_models_config_from_its_claim_read_only() -> None:
    """Without an inline config the profiler builds the model from its config.json: the model's claim is
    mounted read-only where the trainer mounts it, and the hub is off."""
    pod = _profile_pod({"huggingface": {"volumeClaim": "models", "path": "llama-1b", "sequenceLength": 512}})
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/memfit/volumes/models", "readOnly": True}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert _pod_env(pod) | {"MEMFIT_JOB": "x"} == {"MEMFIT_JOB": "x", "MEMFIT_VOLUMES_DIR": "/memfit/volumes",
                                                   "HF_HUB_OFFLINE": "1"}  # fmt: skip


def test_profile_pod_reads_a_hub_models_config_with_the_token_and_the_mirror() -> None:
    from dataclasses import replace

    problem = {"huggingface": {"model": "org/llama", "tokenSecretRef": {"name": "hf"}, "sequenceLength": 512}}
    env = _pod_env(_profile_pod(problem, replace(POD, hub_endpoint="https://mirror.internal")))
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_ENDPOINT"] == "https://mirror.internal" and env["HF_HOME"] == "/tmp/hub"
    assert "HF_HUB_OFFLINE" not in env


def test_profile_pod_with_an_inline_config_reads_nothing() -> None:
    problem = {"huggingface": {"volumeClaim": "models", "path": "m", "config": {"model_type": "llama"},
                               "sequenceLength": 512}}  # fmt: skip
    pod = _profile_pod(problem)
    assert "model" not in {v["name"] for v in pod["volumes"]}
    assert _pod_env(pod)["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in _pod_env(pod)

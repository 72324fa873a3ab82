"""A private hub model fine-tuned through the operator: the stand-in hub (memfit_testbed.hub, on
127.0.0.1) serves the tiny Llama only with a token, the operator runs with the chart's `hub.endpoint`
pointing at it, and the job names only the model, its revision and a Secret with the token (no inline
config) and a private hub dataset. The profile pod reads the model's config.json from the hub; the
training pod's init container downloads the model and prepares the dataset once in the checkpoint
claim; the trainer reads both there with the hub off. A Secret with a token the hub refuses fails the job at once, naming the field."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.hub import (
    PRIVATE_DATASET,
    PRIVATE_MODEL,
    StandInHub,
    private_finetune_repos,
    stand_in_hub,
)
from memfit_testbed.operator_helpers import create_job, get_job, wait_phase
from memfit_testbed.paths import REPO
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 420.0
REPO_ID = PRIVATE_MODEL
DATASET_ID = PRIVATE_DATASET
TOKEN = "hf_stand_in_token_5678"  # a fake token for the stand-in


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from memfit_testbed.finetune_data import make_volumes

    return make_volumes(tmp_path_factory.mktemp("hub-volumes"))


@pytest.fixture(scope="module")
def hub(volumes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    with stand_in_hub(private_finetune_repos(volumes, tmp_path_factory.mktemp("corpus-repo"), TOKEN)) as server:
        yield server


@pytest.fixture(scope="module")
def operator(cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
             hub: StandInHub) -> Iterator[Path]:  # fmt: skip
    with module_operator(cluster, kube, request, tmp_path_factory, env={"MEMFIT_HUB_ENDPOINT": hub.endpoint}) as (
        log,
        _,
    ):
        yield log


def _corpus(cluster: Any, kube: Kube, namespace: str, volumes: Path) -> None:
    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "corpus"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    kube.wait("claim corpus bound", lambda: kube.core.read_namespaced_persistent_volume_claim(
        "corpus", namespace).status.phase == "Bound" or None, timeout=60)  # fmt: skip
    folder = cluster.workdir / "pod-runner" / "claims" / namespace / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "eval.jsonl"):
        (folder / name).write_bytes((volumes / "data" / name).read_bytes())


def _secret(kube: Kube, namespace: str, name: str, token: str) -> None:
    kube.core.create_namespaced_secret(namespace, {
        "metadata": {"name": name}, "data": {"token": base64.b64encode(token.encode()).decode()},
    })  # fmt: skip


def _hub_job(name: str, secret: str, *, inline_config: bool = True, hub_data: bool = False) -> dict[str, Any]:
    """examples/finetune-tiny.yaml with the model from the hub instead of the models volume, no output;
    without `inline_config` the job names only the model (the profile pod reads its config.json)."""
    doc = copy.deepcopy(yaml.safe_load((REPO / "examples" / "finetune-tiny.yaml").read_text()))
    doc["metadata"] = {"name": name}
    hf = doc["spec"]["problem"]["huggingface"]
    for key in ("volumeClaim", "path"):
        hf.pop(key)
    hf |= {"model": REPO_ID, "revision": "main", "initialize": "pretrained", "tokenSecretRef": {"name": secret}}
    if not inline_config:
        hf.pop("config")
    if hub_data:
        doc["spec"]["data"] = {"huggingface": {"name": DATASET_ID, "split": "train"}, "evalSplit": "validation",
                               "evalEverySteps": 3}  # fmt: skip
    doc["spec"].pop("output")
    return doc


def test_a_private_hub_model_and_dataset_are_downloaded_once_and_fine_tuned(
    cluster: Any, kube: Kube, namespace: str, operator: Path, hub: StandInHub, volumes: Path
) -> None:
    _secret(kube, namespace, "hf-token", TOKEN)
    create_job(kube, namespace, _hub_job("hub-tiny", "hf-token", inline_config=False, hub_data=True))
    job = wait_phase(kube, namespace, "hub-tiny", ("Succeeded", "Failed"), TIMEOUT, operator)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"]["step"] == 6 and status["progress"]["tokensPerSecond"] > 0, status["progress"]

    downloads = hub.file_requests(REPO_ID)
    weights = [r for r in downloads if r.path.endswith("/model.safetensors")]
    assert len(weights) == 1, downloads  # once, by the init container; the trainer read the claim
    configs = [r for r in downloads if r.path.endswith("/config.json")]
    assert len(configs) == 2, downloads  # the profile pod (the shape, no weights), then the init container
    corpus = [r for r in hub.requests if r.path.startswith(f"/datasets/{DATASET_ID}/resolve/") and r.method == "GET"]
    assert sorted(r.path.rsplit("/", 1)[-1] for r in corpus if r.path.endswith(".jsonl")) == [
        "train.jsonl", "validation.jsonl"]  # once each, by the init container  # fmt: skip
    asked = [r for r in hub.requests if REPO_ID in r.path]
    assert asked and all(r.authorized for r in asked), asked
    pods = kube.pods(namespace, "memfit.dev/job=hub-tiny,memfit.dev/component=trainer")
    [pod] = pods
    [fetch] = pod["status"]["initContainerStatuses"]
    assert fetch["name"] == "fetch-model" and fetch["state"]["terminated"]["exitCode"] == 0, fetch
    cache = cluster.workdir / "pod-runner" / "claims" / namespace / status["checkpointClaim"] / ".hub"
    assert list(cache.rglob("model.safetensors")), sorted(str(p) for p in cache.rglob("*"))[:20]
    logs = sorted((cluster.workdir / "pod-runner" / "logs").glob(f"{namespace}_{pod['metadata']['name']}_*.log"))
    assert [p.name.rsplit("_", 1)[-1] for p in logs] == ["fetch-model.log", "trainer.log"], logs
    assert not any(TOKEN in p.read_text(errors="replace") for p in logs)  # the token is never printed
    assert TOKEN not in json.dumps(job) and TOKEN not in operator.read_text(errors="replace")


def test_a_refused_token_fails_the_job_at_once_naming_the_field(
    cluster: Any, kube: Kube, namespace: str, operator: Path, hub: StandInHub, volumes: Path
) -> None:
    _corpus(cluster, kube, namespace, volumes)
    _secret(kube, namespace, "hf-wrong", "hf_not_the_token")
    create_job(kube, namespace, _hub_job("hub-refused", "hf-wrong"))
    # Every trainer pod ever seen, until the job ends: a Failed job's unfinished Job is deleted in the pass
    # after Failed is stored (its GPUs given back, docs/operator.md), and its pod may go with it before the
    # Job controller marks the Job Failed, so the count is taken while it runs, not after.
    seen: set[str] = set()
    selector = "memfit.dev/job=hub-refused,memfit.dev/component=trainer"

    def ended() -> dict[str, Any] | None:
        seen.update(p["metadata"]["name"] for p in kube.pods(namespace, selector))
        job = get_job(kube, namespace, "hub-refused")
        return job if job and (job.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None

    job = kube.wait("hub-refused Succeeded or Failed", ended, timeout=TIMEOUT, interval=0.2)
    status = job["status"]
    assert status["phase"] == "Failed", status
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["status"] == "True" and conditions["Failed"]["reason"] == "InvalidPlan", conditions
    assert "spec.problem.huggingface.tokenSecretRef" in status["message"], status["message"]
    assert hub.endpoint in status["message"] and "hf_not_the_token" not in json.dumps(job)
    assert len(seen) == 1, sorted(seen)  # not retried: the fields are wrong

"""The download step against a stand-in hub on 127.0.0.1 (memfit_testbed.hub): `memfit-trainer fetch`
downloads a private model with the token into HF_HOME, `train` then fine-tunes it with the hub off; a
refused token, an unknown revision and an unreachable hub each fail with the field named."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.finetune_data import MODEL_CLAIM, MODEL_PATH, SEQUENCE_LENGTH, data, make_volumes
from memfit_testbed.hub import (
    PRIVATE_DATASET,
    PRIVATE_MODEL,
    StandInHub,
    private_finetune_repos,
    stand_in_hub,
)
from trainer_support import PYTHON, REPO, PlanBuilder, make_plan, run_cli, subprocess_env

REPO_ID = PRIVATE_MODEL
DATASET_ID = PRIVATE_DATASET
TOKEN = "hf_stand_in_token_1234"  # a fake token for the stand-in; never a real one
EXIT_INVALID_PLAN = 88


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("huggingface_hub")
    return make_volumes(tmp_path_factory.mktemp("volumes"))


@pytest.fixture(scope="module")
def hub(volumes: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    with stand_in_hub(private_finetune_repos(volumes, tmp_path_factory.mktemp("corpus-repo"), TOKEN)) as server:
        yield server


def hub_plan(volumes: Path, **hf: Any) -> PlanBuilder:
    config = json.loads((volumes / MODEL_CLAIM / MODEL_PATH / "config.json").read_text())
    problem = {"huggingface": {"model": REPO_ID, "revision": "main", "initialize": "pretrained",
                               "config": config, "sequenceLength": SEQUENCE_LENGTH, **hf}}  # fmt: skip
    return make_plan().problem(problem).optimizer("adamw").learning_rate(1e-2).steps(4)


def fetch(plan: PlanBuilder, tmp: Path, env: dict[str, str]) -> tuple[int, str, dict[str, Any] | None]:
    tmp.mkdir(parents=True, exist_ok=True)
    plan_path = plan.write(tmp / "plan.json")
    termination = tmp / "termination-log"
    proc = subprocess.run([PYTHON, "-m", "memfit_trainer.cli", "fetch", "--plan", str(plan_path)],
                          env=subprocess_env(tmp, **env), cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    text = termination.read_text() if termination.exists() else ""
    return proc.returncode, proc.stdout + proc.stderr, json.loads(text) if text else None


def test_private_model_is_fetched_with_the_token_then_trained_offline(
    hub: StandInHub, volumes: Path, tmp_path: Path
) -> None:
    home = tmp_path / "hub-cache"
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_TOKEN": TOKEN}
    plan = hub_plan(volumes).data(data()).steps(4)
    code, output, message = fetch(plan, tmp_path / "fetch", env)
    assert code == 0, output[-3000:]
    assert message is None and "MiB in" in output and TOKEN not in output
    downloads = hub.file_requests(REPO_ID)
    assert {r.path.rsplit("/", 1)[-1] for r in downloads} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(r.authorized for r in downloads)

    # A second fetch (a re-planned attempt, a replaced pod) finds every file in the cache.
    code, output, _ = fetch(plan, tmp_path / "again", env)
    assert code == 0, output[-3000:]
    assert len(hub.file_requests(REPO_ID)) == len(downloads)

    # The trainer reads the cache with the hub off: the stand-in (still up) is asked nothing.
    before = len(hub.requests)
    offline = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
               "MEMFIT_VOLUMES_DIR": str(volumes)}  # fmt: skip
    (tmp_path / "train").mkdir()
    run = run_cli(plan, tmp_path / "train", env=offline)
    assert run.returncode == 0, run.output[-3000:]
    assert run.termination is not None and run.termination["reason"] == "Completed"
    assert run.termination["steps"] == 4 and run.termination["finalLoss"] > 0
    assert len(hub.requests) == before  # training asked the hub nothing


@pytest.mark.parametrize(
    ("hf", "env", "field"),
    [
        pytest.param({}, {}, "tokenSecretRef", id="private model without a token"),
        pytest.param({}, {"HF_TOKEN": "hf_wrong"}, "tokenSecretRef", id="a token that may not read it"),
        pytest.param({"revision": "v9"}, {"HF_TOKEN": TOKEN}, "spec.problem.huggingface.revision",
                     id="unknown revision"),
        pytest.param({"model": "memfit-test/no-such-model"}, {"HF_TOKEN": TOKEN}, "spec.problem.huggingface.model",
                     id="unknown model"),
    ],
)  # fmt: skip
def test_a_refused_model_is_an_invalid_plan_naming_the_field(
    hub: StandInHub, volumes: Path, tmp_path: Path, hf: dict[str, str], env: dict[str, str], field: str
) -> None:
    full = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hub-cache"), **env}
    code, output, message = fetch(hub_plan(volumes, **hf), tmp_path, full)
    assert code == EXIT_INVALID_PLAN, output[-3000:]
    assert message is not None and message["reason"] == "InvalidPlan", message
    assert field in message["message"] and hub.endpoint in message["message"], message
    assert TOKEN not in message["message"] and "hf_wrong" not in message["message"]
    assert not list((tmp_path / "hub-cache").rglob("*.safetensors"))


def test_a_private_hub_dataset_is_prepared_by_fetch_then_read_offline(
    hub: StandInHub, volumes: Path, tmp_path: Path
) -> None:
    """spec.data from the hub: fetch prepares the train and eval splits in HF_HOME with the token; the
    trainer tokenizes and evaluates them with the hub off."""
    home = tmp_path / "hub-cache"
    data = {"huggingface": {"name": DATASET_ID, "split": "train"}, "evalSplit": "validation", "evalEverySteps": 2}
    plan = hub_plan(volumes).data(data).steps(4)
    code, output, _ = fetch(plan, tmp_path / "fetch", {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home),
                                                        "HF_TOKEN": TOKEN})  # fmt: skip
    assert code == 0, output[-3000:]
    assert f"dataset '{DATASET_ID}' split(s) train, validation prepared" in output
    downloads = [r for r in hub.requests if r.path.startswith(f"/datasets/{DATASET_ID}/resolve/") and r.method == "GET"]
    assert {r.path.rsplit("/", 1)[-1] for r in downloads} >= {"train.jsonl", "validation.jsonl"}
    assert all(r.authorized for r in hub.requests if DATASET_ID in r.path)

    before = len(hub.requests)
    (tmp_path / "train").mkdir()
    offline = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    run = run_cli(plan, tmp_path / "train", env=offline)
    assert run.returncode == 0, run.output[-3000:]
    assert run.termination is not None and run.termination["reason"] == "Completed"
    assert "eval loss" in run.output
    assert len(hub.requests) == before


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param({"huggingface": {"name": "memfit-test/no-such-corpus"}}, "spec.data.huggingface.name",
                     id="unknown dataset"),
        pytest.param({"huggingface": {"name": DATASET_ID}, "evalSplit": "nope", "evalEverySteps": 2},
                     "spec.data.evalSplit", id="unknown eval split"),
    ],
)  # fmt: skip
def test_a_refused_dataset_is_an_invalid_plan_naming_the_field(
    hub: StandInHub, volumes: Path, tmp_path: Path, data: dict[str, Any], field: str
) -> None:
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hub-cache"), "HF_TOKEN": TOKEN}
    code, output, message = fetch(hub_plan(volumes).data(data), tmp_path, env)
    assert code == EXIT_INVALID_PLAN, output[-3000:]
    assert message is not None and message["reason"] == "InvalidPlan" and field in message["message"], message
    assert TOKEN not in message["message"]


def test_a_random_init_hub_model_fetches_its_config_and_tokenizer_but_no_weights(
    hub: StandInHub, volumes: Path, tmp_path: Path
) -> None:
    """`initialize: random` without an inline config: the trainer needs config.json (the shape) and the
    tokenizer (real data), not the weights."""
    home = tmp_path / "hub-cache"
    problem = {"huggingface": {"model": REPO_ID, "initialize": "random", "sequenceLength": SEQUENCE_LENGTH}}
    plan = make_plan().problem(problem).data(data()).steps(2)
    weights_before = len([r for r in hub.file_requests(REPO_ID) if r.path.endswith(".safetensors")])
    code, output, _ = fetch(plan, tmp_path / "fetch", {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home),
                                                        "HF_TOKEN": TOKEN})  # fmt: skip
    assert code == 0, output[-3000:]
    assert not list(home.rglob("*.safetensors")) and list(home.rglob("tokenizer.json"))
    assert len([r for r in hub.file_requests(REPO_ID) if r.path.endswith(".safetensors")]) == weights_before
    (tmp_path / "train").mkdir()
    offline = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
               "MEMFIT_VOLUMES_DIR": str(volumes)}  # fmt: skip
    run = run_cli(plan, tmp_path / "train", env=offline)
    assert run.returncode == 0, run.output[-3000:]


def test_other_nodes_of_a_shared_cache_wait_for_node_0(hub: StandInHub, volumes: Path, tmp_path: Path) -> None:
    """On a claim shared by the nodes of a plan, node 1 downloads nothing: it waits for node 0's marker
    (for this model and data), then starts."""
    home = tmp_path / "hub-cache"
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_TOKEN": TOKEN, "MEMFIT_FETCH_SHARED": "1"}
    plan = hub_plan(volumes)
    plan_path = plan.write(tmp_path / "plan.json")
    waiting = subprocess.Popen([PYTHON, "-m", "memfit_trainer.cli", "fetch", "--plan", str(plan_path)],
                               env=subprocess_env(tmp_path, **env, MEMFIT_NODE_RANK="1"), cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=8)  # nothing until node 0 is done
        before = len(hub.requests)
        code, output, _ = fetch(plan, tmp_path / "node0", {**env, "MEMFIT_NODE_RANK": "0"})
        assert code == 0, output[-3000:]
        assert waiting.wait(timeout=60) == 0
        assert "node 0 downloaded into" in (waiting.stdout.read() if waiting.stdout else "")
        assert len(hub.requests) > before and (home / ".memfit-fetched").is_file()
    finally:
        waiting.kill()


def test_an_unreachable_hub_is_a_retryable_error(volumes: Path, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hub-cache"), "HF_TOKEN": TOKEN}
    code, output, message = fetch(hub_plan(volumes), tmp_path, env)
    assert code == 1, output[-3000:]
    assert message is not None and message["reason"] == "TrainingError", message
    assert "could not download 'memfit-test/tiny-llama'" in message["message"] and endpoint in message["message"]


def test_nothing_to_fetch_for_a_volume_model(volumes: Path, tmp_path: Path) -> None:
    plan = make_plan().problem({"huggingface": {"volumeClaim": MODEL_CLAIM, "path": MODEL_PATH,
                                                "sequenceLength": SEQUENCE_LENGTH}})  # fmt: skip
    code, output, _ = fetch(plan, tmp_path, {"HF_HUB_OFFLINE": "1"})
    assert code == 0 and "nothing to download" in output, output[-3000:]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

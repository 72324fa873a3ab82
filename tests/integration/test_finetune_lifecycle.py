"""A real fine-tune through the operator on the real control plane: a pretrained tiny Llama and a JSONL
corpus on PersistentVolumeClaims (the test bed's provisioner binds them to folders the pod runner mounts in
every pod), profile -> plan -> train -> the fine-tuned model saved in Hugging Face format on the output
claim. The saved model loads with `from_pretrained` and beats the starting model on held-out text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, wait_phase
from memfit_testbed.paths import REPO
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 420.0


@pytest.fixture(scope="module")
def operator(cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Path]:
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, _):
        yield log


def _claim(kube: Kube, namespace: str, name: str) -> None:
    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    })
    kube.wait(f"claim {name} bound", lambda: kube.core.read_namespaced_persistent_volume_claim(
        name, namespace).status.phase == "Bound" or None, timeout=60)


def test_examples_finetune_tiny_trains_the_pretrained_model_on_its_corpus_and_saves_it(
    cluster: Any, kube: Kube, namespace: str, operator: Path
) -> None:
    pytest.importorskip("transformers")
    from memfit_testbed.finetune_data import MODEL_CLAIM, MODEL_PATH, document_loss, make_volumes, sentences

    for claim in ("models", "corpus"):
        _claim(kube, namespace, claim)
    claims = cluster.workdir / "pod-runner" / "claims" / namespace
    made = make_volumes(claims)  # claims/models/tiny-llama, claims/data/{train,eval}.jsonl
    (claims / "corpus").mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "eval.jsonl"):
        (claims / "corpus" / name).write_bytes((made / "data" / name).read_bytes())

    doc = yaml.safe_load((REPO / "examples" / "finetune-tiny.yaml").read_text())
    doc["metadata"].pop("namespace", None)
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, "finetune-tiny", ("Succeeded", "Failed"), TIMEOUT, operator)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["profile"]["source"] == "measured", status["profile"]

    out = claims / "models" / "out" / "tiny-llama-ft"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "memfit_training.json"):
        assert (out / name).is_file(), sorted(p.name for p in out.iterdir()) if out.exists() else out
    held_out = sentences(24, seed=1)  # eval.jsonl's documents
    before = document_loss(claims / MODEL_CLAIM / MODEL_PATH, held_out)
    after = document_loss(out, held_out)
    assert after < before - 0.5, (before, after)
    summary = json.loads((out / "memfit_training.json").read_text())
    assert summary["final_eval_loss"] < summary["initial_eval_loss"], summary
    assert [step for step, _ in summary["eval_losses"]] == [0, 3, 6], summary["eval_losses"]
    print(f"eval loss: {summary['initial_eval_loss']:.3f} -> {summary['final_eval_loss']:.3f}; "
          f"held-out loss from_pretrained: {before:.3f} -> {after:.3f}; saved: {out}")

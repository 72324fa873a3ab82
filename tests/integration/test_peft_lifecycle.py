"""A tiny LoRA and a tiny QLoRA fine-tune on the real control plane: profile -> plan -> train -> adapter
saved on the output claim, and the saved adapter, loaded into a freshly built model, reproduces the
trained model's loss (the pod runner keeps a claim's folder after its pods, like a PersistentVolume)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.operator_helpers import create_job, quickstart, wait_phase
from operator_ready import module_operator

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TIMEOUT = 420.0


@pytest.fixture(scope="module")
def operator(cluster: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Path]:
    with module_operator(cluster, kube, request, tmp_path_factory) as (log, _):
        yield log


def _bound_claim(kube: Kube, namespace: str, claim: str, request: pytest.FixtureRequest) -> None:
    """A PersistentVolumeClaim pre-bound to a hostPath PersistentVolume (the test cluster has no
    provisioner); the pod runner maps it to a folder that outlives the pods."""
    volume = f"{claim}-{namespace}"[:63]
    kube.core.create_persistent_volume({
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                 "hostPath": {"path": f"/tmp/{volume}"},
                 "claimRef": {"namespace": namespace, "name": claim}},
    })
    request.addfinalizer(lambda: kube.core.delete_persistent_volume(volume))
    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual", "volumeName": volume,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    kube.wait(f"claim {claim} bound", lambda: kube.core.read_namespaced_persistent_volume_claim(
        claim, namespace).status.phase == "Bound", timeout=60)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_tiny_peft_job_trains_and_its_adapter_reproduces_the_loss(
    method: str, cluster: Any, kube: Kube, namespace: str, operator: Path, request: pytest.FixtureRequest
) -> None:
    import torch
    from memfit.api.plan import Plan
    from memfit_trainer.problems import build_problem
    from memfit_trainer.strategies.peft import (
        ADAPTER_CONFIG,
        EVAL_FILE,
        MEMFIT_ADAPTER,
        apply_peft,
        eval_loss,
        load_adapter,
    )

    name = f"tiny-{method}"
    _bound_claim(kube, namespace, "models", request)
    doc = quickstart(name, output={"volumeClaim": "models", "path": f"out/{name}"})
    doc["spec"]["strategy"] = {"precision": "bf16", "peft": {"method": method, "lora": {"rank": 4}}}
    create_job(kube, namespace, doc)
    job = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), TIMEOUT, operator)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["plan"]["peft"] == method
    plan_cm = kube.core.read_namespaced_config_map(f"{name}-plan-0", namespace)
    plan = Plan.model_validate_json(plan_cm.data["plan.json"])
    assert plan.peft.value == method and plan.adapter is not None and plan.adapter.rank == 4
    assert plan.trainable_parameters is not None and plan.parameters is not None
    assert plan.trainable_parameters < plan.parameters / 10

    folder = cluster.workdir / "pod-runner" / "claims" / namespace / "models" / "out" / name
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    assert json.loads((folder / MEMFIT_ADAPTER).read_text())["method"] == method
    recorded = json.loads((folder / EVAL_FILE).read_text())
    assert plan.problem is not None
    problem = build_problem(plan.problem, seed=recorded["seed"])
    apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=torch.device("cpu"))
    assert load_adapter(problem.model, folder) == 2 * 4 * 2  # 2 blocks x 4 layers x (A, B)
    loss = eval_loss(problem, plan.precision, seed=recorded["seed"], step=recorded["step"],
                     device=torch.device("cpu"))
    assert loss == pytest.approx(recorded["loss"], rel=1e-5)

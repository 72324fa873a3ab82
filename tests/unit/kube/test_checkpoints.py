"""The checkpoint volume: memfit's `<job>-checkpoints` claim (owned, sized from the plan), the user's claim,
or an emptyDir only when asked; and the training Job mounting the right one."""

from __future__ import annotations

import pytest
from factories import OWNER, PLACEMENT, POD, make_plan, make_spec
from memfit.api.common import Offload
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.plan import MemoryBreakdown
from memfit.kube.checkpoints import (
    GIB,
    CheckpointStorage,
    VolumeKind,
    build_checkpoint_claim,
    checkpoint_volume,
    estimate_checkpoint_bytes,
    estimate_claim_bytes,
    estimate_hub_download_bytes,
    parse_quantity,
    quantity,
    shared_across_nodes,
)
from memfit.kube.train_job import build_training_job
from pydantic import ValidationError


def _memory(*, parameters: int, optimizer: int, host: int = 0, nvme: int = 0) -> MemoryBreakdown:
    return MemoryBreakdown(parameters_bytes=parameters, gradients_bytes=0, optimizer_bytes=optimizer,
                           activations_bytes=0, temporaries_bytes=0, overhead_bytes=0, peak_bytes=0,
                           host_bytes=host, nvme_bytes=nvme)  # fmt: skip


def _volumes(spec: MemoryOptimizedTrainingJobSpec) -> dict[str, dict[str, object]]:
    job = build_training_job(owner=OWNER, spec=spec, plan=make_plan(), placement=PLACEMENT, pod=POD)
    return {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}


@pytest.mark.parametrize(
    ("checkpoint", "kind", "volume"),
    [
        pytest.param({}, VolumeKind.CREATED, {"persistentVolumeClaim": {"claimName": "llama-checkpoints"}},
                     id="default: memfit's claim"),
        pytest.param({"volumeClaim": "ckpt"}, VolumeKind.CLAIM, {"persistentVolumeClaim": {"claimName": "ckpt"}},
                     id="the user's claim"),
        pytest.param({"emptyDir": True}, VolumeKind.EMPTY_DIR, {"emptyDir": {}}, id="emptyDir when asked"),
    ],
)  # fmt: skip
def test_the_job_mounts_the_durable_volume_unless_an_empty_dir_is_asked_for(
    checkpoint: dict[str, object], kind: VolumeKind, volume: dict[str, object]
) -> None:
    spec = make_spec(training={"checkpoint": checkpoint})
    assert checkpoint_volume(spec, OWNER.name).kind == kind
    assert checkpoint_volume(spec, OWNER.name).durable == (kind != VolumeKind.EMPTY_DIR)
    assert _volumes(spec)["checkpoints"] == {"name": "checkpoints", **volume}


def test_claim_and_empty_dir_exclude_each_other_naming_the_field() -> None:
    with pytest.raises(ValidationError) as error:
        make_spec(training={"checkpoint": {"volumeClaim": "ckpt", "emptyDir": True}})
    assert "volumeClaim and emptyDir exclude each other" in str(error.value)
    assert "checkpoint" in str(error.value)


def test_created_claim_is_owned_by_the_job_with_the_settings_class_and_mode() -> None:
    storage = CheckpointStorage(storage_class="efs-sc", access_mode="ReadWriteMany", min_bytes=10 * GIB)
    claim = build_checkpoint_claim(owner=OWNER, plan=make_plan(), storage=storage)
    meta = claim["metadata"]
    assert (claim["kind"], meta["name"], meta["namespace"]) == ("PersistentVolumeClaim", "llama-checkpoints", "ml")
    assert meta["ownerReferences"] == [OWNER.reference()]
    assert meta["ownerReferences"][0]["uid"] == "1234-uid" and meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"]["memfit.dev/job"] == "llama"
    assert claim["spec"]["storageClassName"] == "efs-sc"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"  # tiny plan: the floor


def test_default_storage_class_is_left_to_the_cluster() -> None:
    claim = build_checkpoint_claim(owner=OWNER, plan=make_plan(), storage=CheckpointStorage())
    assert "storageClassName" not in claim["spec"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize(
    ("engine_stage", "memory", "expected"),
    [
        # 8 GPUs (2 nodes x 4). ZeRO-2: weights replicated (saved once), optimizer state sharded (x 8).
        pytest.param(2, _memory(parameters=2 * GIB, optimizer=3 * GIB), 2 * GIB + 8 * 3 * GIB, id="zero2"),
        # ZeRO-3 shards the weights too.
        pytest.param(3, _memory(parameters=GIB, optimizer=GIB), 8 * GIB + 8 * GIB, id="zero3"),
        # Stage 0 (DDP): every rank holds the whole state; one copy is saved.
        pytest.param(0, _memory(parameters=4 * GIB, optimizer=8 * GIB), 12 * GIB, id="ddp"),
        # Offloaded optimizer state (host RAM / NVMe) is saved as well.
        pytest.param(2, _memory(parameters=GIB, optimizer=0, host=GIB, nvme=GIB), GIB + 8 * 2 * GIB, id="offload"),
    ],
)  # fmt: skip
def test_checkpoint_bytes_are_the_model_states_of_the_whole_job(
    engine_stage: int, memory: MemoryBreakdown, expected: int
) -> None:
    plan = make_plan(zero_stage=engine_stage, memory=memory, offload=Offload.NONE)
    assert plan.world_size == 8
    assert estimate_checkpoint_bytes(plan) == expected


def test_claim_size_is_three_copies_with_margin_in_whole_gib_above_the_floor() -> None:
    plan = make_plan(zero_stage=3, memory=_memory(parameters=GIB, optimizer=2 * GIB))  # 24 GiB of states
    assert estimate_claim_bytes(plan, min_bytes=10 * GIB) == 90 * GIB  # 24 x 3 x 1.25
    assert estimate_claim_bytes(plan, min_bytes=100 * GIB) == 100 * GIB
    odd = make_plan(zero_stage=0, memory=_memory(parameters=GIB // 3, optimizer=0))
    assert estimate_claim_bytes(odd, min_bytes=0) == 2 * GIB  # 1.25 GiB rounds up
    storage = CheckpointStorage(min_bytes=10 * GIB)
    assert build_checkpoint_claim(owner=OWNER, plan=plan, storage=storage)["spec"]["resources"] == {
        "requests": {"storage": "90Gi"}
    }


def test_claim_also_holds_a_hub_models_download() -> None:
    """The download step puts the hub model on the claim (HF_HOME): its parameters at the dtype its
    config names, 4 bytes each when it names none; a volume or random-init model adds nothing."""
    from memfit.api.problem import Problem

    def hub(config: dict[str, object] | None, **hf: object) -> object:
        problem = {"huggingface": {"model": "org/llama", "initialize": "pretrained", "sequenceLength": 64, **hf}}
        if config is not None:
            problem["huggingface"]["config"] = {"model_type": "llama", **config}  # type: ignore[index]
        return make_plan(zero_stage=3, memory=_memory(parameters=GIB, optimizer=2 * GIB),
                         problem=Problem.model_validate(problem), parameters=8 * GIB)  # fmt: skip

    assert estimate_hub_download_bytes(hub({"torch_dtype": "bfloat16"})) == 16 * GIB  # 8 Gi params x 2 B
    assert estimate_hub_download_bytes(hub(None)) == 32 * GIB  # dtype unknown: 4 B
    assert estimate_claim_bytes(hub({"torch_dtype": "bfloat16"}), min_bytes=0) == 110 * GIB  # (72 + 16) x 1.25
    volume = hub(None, volumeClaim="models", path="llama")
    assert estimate_hub_download_bytes(volume) == 0


def test_only_read_write_many_is_shared_across_nodes() -> None:
    assert shared_across_nodes(["ReadWriteMany"]) and shared_across_nodes(["ReadWriteOnce", "ReadWriteMany"])
    assert not shared_across_nodes(["ReadWriteOnce"]) and not shared_across_nodes([])


@pytest.mark.parametrize(
    ("text", "value"),
    [("10Gi", 10 * GIB), ("500Mi", 500 << 20), ("1.5Gi", 3 * GIB // 2), ("2G", 2 * 10**9), ("2048", 2048)],
)
def test_quantities(text: str, value: int) -> None:
    assert parse_quantity(text) == value


def test_bad_quantity_says_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"'ten' is not a storage quantity \(e.g. 10Gi"):
        parse_quantity("ten")
    assert quantity(3 * GIB) == "3Gi" and quantity(GIB + 1) == str(GIB + 1)

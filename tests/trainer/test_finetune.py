"""Real fine-tuning through the trainer CLI: pretrained tiny Llama from a volume, JSONL data, HF output."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from memfit_testbed.finetune_data import (
    DATA_CLAIM,
    MAX_POSITIONS,
    MODEL_CLAIM,
    MODEL_PATH,
    data,
    document_loss,
    make_volumes,
    problem,
    sentences,
)
from trainer_support import PlanBuilder, losses, make_plan, run_as_user, run_cli

STEPS = 6
EXIT_INVALID_PLAN = 88


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    return make_volumes(tmp_path_factory.mktemp("volumes"))


def finetune_plan(**data_extra: Any) -> PlanBuilder:
    return (make_plan().problem(problem()).data(data(evalEverySteps=3, **data_extra)).optimizer("adamw")
            .learning_rate(1e-2).steps(STEPS))


def run(plan: PlanBuilder, tmp: Path, volumes: Path) -> tuple[Any, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out"
    result = run_cli(plan, tmp, env={"MEMFIT_VOLUMES_DIR": str(volumes), "MEMFIT_OUTPUT_DIR": str(out),
                                     "HF_HUB_OFFLINE": "1"})
    return result, out


def assert_saved_model_learned(out: Path, volumes: Path) -> dict[str, Any]:
    """The output loads with from_pretrained and beats the starting model on held-out text."""
    for name in ("config.json", "model.safetensors", "tokenizer.json", "memfit_training.json"):
        assert (out / name).is_file(), name
    held_out = sentences(24, seed=1)  # eval.jsonl's documents
    before = document_loss(volumes / MODEL_CLAIM / MODEL_PATH, held_out)
    after = document_loss(out, held_out)
    assert after < before - 0.5, (before, after)
    summary = json.loads((out / "memfit_training.json").read_text())
    assert [step for step, _ in summary["eval_losses"]] == [0, 3, 6]
    assert summary["final_eval_loss"] < summary["initial_eval_loss"]
    assert summary["steps"] == STEPS and summary["data"]["files"]["path"] == "train.jsonl"
    return summary


def test_world1_ddp_finetune_saves_a_model_that_learned(volumes: Path, tmp_path: Path) -> None:
    result, out = run(finetune_plan().ddp().batch(2, 2), tmp_path, volumes)
    assert result.returncode == 0, result.output[-3000:]
    summary = assert_saved_model_learned(out, volumes)
    # The trainer's own eval loss at step 0 is the pretrained model's (weights were loaded, not random).
    assert summary["initial_eval_loss"] == pytest.approx(
        document_loss(volumes / MODEL_CLAIM / MODEL_PATH, sentences(24, seed=1)), rel=0.05)


def test_bf16_pretrained_weights_are_saved_back_in_bf16(tmp_path_factory: pytest.TempPathFactory,
                                                        tmp_path: Path) -> None:
    """Weights published in bf16 (as most hub models are) train with fp32 master weights under DDP and
    are saved back in bf16, half the size of an fp32 copy, config.json saying so."""
    from safetensors import safe_open

    volumes = make_volumes(tmp_path_factory.mktemp("bf16"), dtype="bfloat16")
    result, out = run(finetune_plan().ddp().batch(2, 2), tmp_path, volumes)
    assert result.returncode == 0, result.output[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16", config
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        dtypes = {str(weights.get_tensor(k).dtype) for k in weights.keys()}  # noqa: SIM118
    assert dtypes == {"torch.bfloat16"}, dtypes
    held_out = sentences(24, seed=1)
    assert document_loss(out, held_out) < document_loss(volumes / MODEL_CLAIM / MODEL_PATH, held_out) - 0.5


def test_world2_ddp_sees_the_same_samples_as_world1(volumes: Path, tmp_path: Path) -> None:
    """Same global batch, other world size and micro-batch: the same samples per step, so the same losses."""
    one, _ = run(finetune_plan().ddp().batch(4, 1), tmp_path / "w1", volumes)
    two, out = run(finetune_plan().ddp().world(2).batch(1, 2), tmp_path / "w2", volumes)
    assert one.returncode == 0 and two.returncode == 0, (one.output[-2000:], two.output[-2000:])
    assert losses(two.reports[0]) == pytest.approx(losses(one.reports[0]), rel=1e-4)
    rank0, rank1 = ([loss for _, loss in two.reports[r]["eval_losses"]] for r in (0, 1))
    assert rank0 == pytest.approx(rank1, rel=1e-6)  # every rank evaluates the whole eval set
    assert_saved_model_learned(out, volumes)


@pytest.fixture(scope="module")
def tied_volumes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return make_volumes(tmp_path_factory.mktemp("tied"), tied=True)


@pytest.mark.parametrize(("engine", "tied"), [
    ("zero3", False),
    pytest.param("fsdp3", False, marks=pytest.mark.extended),  # each engine and the tied head stay in `make test`
    pytest.param("zero3", True, marks=pytest.mark.extended),
    ("fsdp3", True),
], ids=["zero3", "fsdp3", "zero3-tied", "fsdp3-tied"])
def test_sharded_world2_finetune_saves_consolidated_weights(engine: str, tied: bool, request: pytest.FixtureRequest,
                                                            tmp_path: Path) -> None:
    """Weights gathered from ZeRO-3 partitions / FSDP2 shards; tied input/output embeddings (Llama-3.2-1B)
    are saved once and stay tied when loaded. Loading never puts the whole model on every rank: ZeRO-3
    builds it under zero.Init; under FSDP only rank 0 reads the weights, rank 1 builds on the meta device
    and receives its shards (and the rotary buffers) from rank 0, and still learns the same model."""
    volumes = request.getfixturevalue("tied_volumes" if tied else "volumes")
    plan = finetune_plan().world(2).batch(1, 2)
    plan = plan.deepspeed(3) if engine == "zero3" else plan.fsdp(3)
    result, out = run(plan, tmp_path, volumes)
    assert result.returncode == 0, result.output[-3000:]
    if engine == "fsdp3":
        assert [result.reports[r]["facts"].get("pretrained_from_rank0") for r in (0, 1)] == [True, True]
        # The step-0 eval loss is the pretrained model's on both ranks (rank 1's shards came from rank 0).
        initial = [result.reports[r]["eval_losses"][0][1] for r in (0, 1)]
        assert initial[0] == pytest.approx(initial[1], rel=1e-6)
        assert initial[0] == pytest.approx(document_loss(volumes / MODEL_CLAIM / MODEL_PATH, sentences(24, seed=1)),
                                           rel=0.05)
    assert_saved_model_learned(out, volumes)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    shared = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert shared == tied


def test_chat_messages_are_rendered_with_the_chat_template(volumes: Path, tmp_path: Path) -> None:
    plan = (make_plan().problem(problem()).steps(2)
            .data({"files": {"volumeClaim": DATA_CLAIM, "path": "chat.jsonl"}, "messagesField": "messages"}))
    result, out = run(plan, tmp_path, volumes)
    assert result.returncode == 0, result.output[-3000:]
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("plan", "field", "words"),
    [
        (make_plan().problem({"huggingface": {"volumeClaim": MODEL_CLAIM, "path": "no-such-model"}}).data(data()),
         "spec.problem.huggingface.path", "does not exist on volume 'models'"),
        (make_plan().problem(problem()).data(data(textField="body")), "spec.data.textField",
         "no column 'body'"),
        (make_plan().problem(problem()).data(
            {"files": {"volumeClaim": DATA_CLAIM, "path": "numbers.jsonl"}}), "spec.data.textField",
         "must hold text; row 0 holds int"),
        (make_plan().problem(problem(sequenceLength=MAX_POSITIONS + 1)).data(data()),
         "spec.problem.huggingface.sequenceLength", f"exceeds the model's max_position_embeddings {MAX_POSITIONS}"),
        (make_plan().problem(problem(config={"model_type": "llama", "hidden_size": 64})).data(data()),
         "spec.problem.huggingface.config.hidden_size", "the pretrained weights' config says 32"),
    ],
    ids=["missing model path", "missing text field", "text field not text", "sequence too long",
         "inline config disagrees"],
)
def test_bad_input_is_refused_naming_the_field(plan: PlanBuilder, field: str, words: str, volumes: Path,
                                               tmp_path: Path) -> None:
    result, out = run(plan.steps(1), tmp_path, volumes)
    assert result.returncode == EXIT_INVALID_PLAN, result.output[-3000:]
    assert result.termination is not None and result.termination["reason"] == "InvalidPlan"
    message = result.termination["message"]
    assert field in message and words in message, message
    assert not (out / "model.safetensors").exists()


def test_example_manifest_finetunes_on_the_local_volumes(volumes: Path, tmp_path: Path) -> None:
    """examples/finetune-tiny.yaml's problem, data and training, run as the operator would hand them over
    (its planning config must agree with the weights, or the trainer would refuse them)."""
    import yaml
    from trainer_support import REPO

    spec = yaml.safe_load((REPO / "examples" / "finetune-tiny.yaml").read_text())["spec"]
    root = tmp_path / "volumes"
    root.mkdir()
    (root / "models").symlink_to(volumes / MODEL_CLAIM)
    (root / "corpus").symlink_to(volumes / DATA_CLAIM)
    training = spec["training"]
    plan = (make_plan().problem(spec["problem"]).data(spec["data"]).ddp().batch(training["globalBatchSize"], 1)
            .steps(training["maxSteps"]).learning_rate(training["learningRate"]))
    result, out = run(plan, tmp_path, root)
    assert result.returncode == 0, result.output[-3000:]
    assert_saved_model_learned(out, volumes)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "arrow"])
def test_table_formats_pack_the_same_tokens_as_jsonl(fmt: str, volumes: Path, tmp_path: Path) -> None:
    """parquet, csv and a `datasets` save_to_disk folder (arrow) hold the same rows as train.jsonl: the packed
    samples the trainer draws are identical."""
    datasets = pytest.importorskip("datasets")
    from memfit.api.data import DataSpec
    from memfit.api.problem import HuggingFaceProblem
    from memfit_trainer.problems import BatchKey
    from memfit_trainer.problems.huggingface import Finetune, build_huggingface

    rows = datasets.load_dataset("json", data_files=str(volumes / DATA_CLAIM / "train.jsonl"), split="train",
                                 cache_dir=str(tmp_path / "cache"))
    root = tmp_path / "volumes"
    (root / "tables").mkdir(parents=True)
    (root / MODEL_CLAIM).symlink_to(volumes / MODEL_CLAIM)
    target = root / "tables" / f"train.{fmt}"
    if fmt == "parquet":
        rows.to_parquet(str(target))
    elif fmt == "csv":
        rows.to_csv(str(target), index=False)
    else:
        rows.save_to_disk(str(target))
    spec = HuggingFaceProblem.model_validate(problem()["huggingface"])

    def first_batches(data: dict[str, Any], volumes_dir: Path) -> list[Any]:
        built = build_huggingface(spec, finetune=Finetune(data=DataSpec.model_validate(data), global_batch_size=4,
                                                          environ={"MEMFIT_VOLUMES_DIR": str(volumes_dir)}))
        return [built.make_batch(BatchKey(seed=0, step=s, sample_start=0, samples=4))["input_ids"] for s in (1, 2)]

    table = first_batches({"files": {"volumeClaim": "tables", "path": target.name, "format": fmt}}, root)
    jsonl = first_batches({"files": {"volumeClaim": DATA_CLAIM, "path": "train.jsonl"}}, volumes)
    assert all(bool((a == b).all()) for a, b in zip(table, jsonl, strict=True))


def test_profiler_builds_a_volume_model_from_its_inline_config_without_the_volume(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile pod mounts no model volume: with an inline config it builds the architecture from that
    (random weights, synthetic data) and never looks for the weights."""
    pytest.importorskip("transformers")
    from memfit.api.problem import HuggingFaceProblem
    from memfit_trainer.problems.huggingface import build_huggingface

    monkeypatch.setenv("MEMFIT_VOLUMES_DIR", str(tmp_path / "empty"))
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}
    spec = HuggingFaceProblem.model_validate({"volumeClaim": MODEL_CLAIM, "path": MODEL_PATH, "config": config,
                                              "sequenceLength": 16})
    built = build_huggingface(spec)
    assert len(built.blocks) == 2 and built.tokenizer is None and built.eval_batches is None
    with pytest.raises(ValueError, match=r"spec\.problem\.huggingface\.path: 'tiny-llama' does not exist"):
        from memfit_trainer.problems.huggingface import Finetune

        build_huggingface(spec, finetune=Finetune(environ={"MEMFIT_VOLUMES_DIR": str(tmp_path / "empty")}))


@pytest.mark.parametrize("world", [1, 2], ids=["same world", "re-planned to 2 ranks"])
def test_resumed_finetune_continues_the_same_loss_curve(world: int, volumes: Path, tmp_path: Path) -> None:
    """Stopped after 3 steps and resumed from the checkpoint (pretrained weights overwritten by it), the run
    draws the same samples at steps 4-6 as an uninterrupted one: same losses, also when the re-plan put it
    on 2 ranks with another micro-batch (the global batch is kept)."""
    whole, _ = run(finetune_plan().ddp().batch(2, 2), tmp_path / "whole", volumes)
    ckpt = tmp_path / "ckpt"
    first, _ = run(finetune_plan().ddp().batch(2, 2).steps(3, every=3).checkpoint_dir(ckpt), tmp_path / "a", volumes)
    second = finetune_plan().ddp().world(2).batch(1, 2) if world == 2 else finetune_plan().ddp().batch(2, 2)
    rest, out = run(second.steps(STEPS, every=3).checkpoint_dir(ckpt), tmp_path / "b", volumes)
    assert whole.returncode == first.returncode == rest.returncode == 0, rest.output[-3000:]
    assert rest.reports[0]["resumed_from_step"] == 3
    assert losses(first.reports[0]) + losses(rest.reports[0]) == pytest.approx(losses(whole.reports[0]), rel=1e-4)
    assert json.loads((out / "memfit_training.json").read_text())["resumed_from_step"] == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another UID needs root")
def test_files_the_pods_user_may_not_read_are_refused_as_permission_problems(volumes: Path) -> None:
    """The reported case: model.safetensors (then train.jsonl) 0600 and owned by root, the trainer running as
    another UID. transformers says "No such file or directory"; the refusal names the file, its mode and
    owner, the trainer's ids and the fix, under the field that points at it."""
    from memfit.api.data import DataSpec
    from memfit.api.problem import HuggingFaceProblem
    from memfit_trainer.problems import ProblemError
    from memfit_trainer.problems.huggingface import Finetune, build_huggingface

    root = Path(tempfile.mkdtemp(prefix="memfit-volumes-", dir="/tmp"))  # pytest's own folder is root's only
    try:
        shutil.copytree(volumes, root, dirs_exist_ok=True)
        root.chmod(0o755)  # after the copy, which gives it the source's mode
        spec = HuggingFaceProblem.model_validate(problem()["huggingface"])
        finetune = Finetune(data=DataSpec.model_validate(data()), environ={"MEMFIT_VOLUMES_DIR": str(root)})
        build_huggingface(spec, finetune=finetune)  # as root: it loads (and imports what the child needs)

        def refusal() -> str:
            with pytest.raises(ProblemError) as refused:
                build_huggingface(spec, finetune=finetune)
            return str(refused.value)

        uid = 4242
        weights, corpus = root / MODEL_CLAIM / MODEL_PATH / "model.safetensors", root / DATA_CLAIM / "train.jsonl"
        weights.chmod(0o600)
        message = run_as_user(uid, refusal)
        assert message.startswith(f"spec.problem.huggingface.path: cannot load pretrained weights from "
                                  f"'{weights.parent}': permission denied: cannot read file {weights}, mode 0600, "
                                  f"owner uid:gid 0:0; the trainer runs as UID {uid} GID {uid}"), message
        assert "trainer.fsGroup" in message and "No such file" not in message
        weights.chmod(0o644)
        corpus.chmod(0o600)
        message = run_as_user(uid, refusal)
        assert message.startswith(f"spec.data.files.path: 'train.jsonl' on volume '{DATA_CLAIM}': permission "
                                  f"denied: cannot read file {corpus}, mode 0600, owner uid:gid 0:0"), message
    finally:
        shutil.rmtree(root)

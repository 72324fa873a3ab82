"""LoRA and QLoRA in the trainer: only the adapters train, the base stays frozen (16-bit or 4-bit), the
adapter is saved in peft's layout and reproduces the trained model's loss, and a killed run resumes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_support import make_plan

pytestmark = pytest.mark.trainer

STEPS, EVERY = 6, 2


@pytest.mark.parametrize(
    ("method", "precision"),
    [pytest.param("lora", "fp32", id="lora fp32"), pytest.param("lora", "bf16", id="lora bf16"),
     pytest.param("qlora", "bf16", id="qlora bf16 nf4")],
)
def test_only_adapters_train_and_the_saved_adapter_reproduces_the_loss(
    method: str, precision: str, tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    import torch
    from memfit.api.plan import Plan
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies.peft import ADAPTER_CONFIG, EVAL_FILE, apply_peft, eval_loss, load_adapter

    builder = make_plan().precision(precision).peft(method).steps(STEPS).learning_rate(1e-2)
    result = train_local(builder, output_dir=tmp_path / "adapter")
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < losses[0]
    # 2 blocks x r(in + out) over qkv (64->192), proj (64->64), fc (64->256), out (256->64)
    assert result.adapter_parameters == 2 * 8 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    # Adam m and v over the adapters only, plus one fp32 step counter per adapter tensor (16)
    assert result.facts["optimizer_state_bytes"] == 8 * result.adapter_parameters + 4 * 16
    if method == "qlora":
        assert "torch.uint8" in result.facts["param_dtypes"]
    assert (tmp_path / "adapter" / ADAPTER_CONFIG).exists()
    recorded = json.loads((tmp_path / "adapter" / EVAL_FILE).read_text())

    # A fresh model with the same (seeded) base and the saved adapter gives the trained model's loss.
    plan: Plan = builder.build()
    assert plan.problem is not None
    problem = build_problem(plan.problem, seed=0)
    apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=torch.device("cpu"))
    assert load_adapter(problem.model, tmp_path / "adapter") == 4 * 2 * 2
    batch = problem.make_batch(BatchKey(seed=0, step=STEPS + 1, sample_start=0, samples=4))
    trained = train_local(builder.steps(STEPS + 1), output_dir=tmp_path / "again")
    dtype = {"bf16": torch.bfloat16, "fp32": None}[precision]
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = problem.loss_fn(problem.model, batch).item()
    # step 7's loss (before its update) is the trained model's loss on that batch
    assert loss == pytest.approx(trained.losses[-1][1], rel=2e-2 if dtype else 1e-4)
    # and the loss recorded beside the adapter is reproduced by the reloaded adapter
    again = eval_loss(problem, plan.precision, seed=0, step=recorded["step"], device=torch.device("cpu"))
    assert again == pytest.approx(recorded["loss"], rel=1e-6)


@pytest.mark.parametrize(("engine", "method"), [pytest.param("ddp", "qlora", id="qlora ddp"),
                                                pytest.param("fsdp", "lora", id="lora fsdp"),
                                                pytest.param("deepspeed", "lora", id="lora zero3"),
                                                pytest.param("fsdp", "qlora", id="qlora fsdp")])
def test_a_peft_run_resumes_from_its_checkpoint_with_the_same_losses(
    engine: str, method: str, tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    plan = make_plan().bf16().peft(method)
    plan = {"fsdp": plan.fsdp(3), "deepspeed": plan.deepspeed(3)}.get(engine, plan)
    expected = [loss for _, loss in train_local(plan.steps(STEPS)).losses]
    folder = tmp_path / "ckpt"
    train_local(plan.steps(4, every=EVERY).checkpoint_dir(folder), checkpoint_dir=folder)
    result = train_local(plan.steps(STEPS, EVERY).checkpoint_dir(folder), checkpoint_dir=folder)
    assert result.resumed_from_step == 4 and result.resumed_natively is True
    assert [loss for _, loss in result.losses] == pytest.approx(expected[4:], rel=1e-3)
    assert (folder / "adapter" / "adapter_model.bin").exists()


def test_unknown_target_modules_are_refused() -> None:
    import torch
    from memfit_trainer.problems import build_problem
    from memfit_trainer.strategies.peft import PeftError, apply_peft

    plan = make_plan().peft("lora", targets=("q_proj",)).build()
    assert plan.problem is not None
    problem = build_problem(plan.problem, seed=0)
    with pytest.raises(PeftError, match=r"\['q_proj'\] are not linear layers.*fc, out, proj, qkv"):
        apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision,
                   device=torch.device("cpu"))


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_the_merged_model_loads_into_the_plain_model_and_gives_the_trained_loss(
    method: str, tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    import torch
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies.peft import MERGED_WEIGHTS

    builder = make_plan().bf16().peft(method).steps(STEPS).learning_rate(1e-2)
    train_local(builder, output_dir=tmp_path / "out", save_merged=True)
    trained = train_local(builder.steps(STEPS + 1), output_dir=tmp_path / "again")
    plan = builder.build()
    assert plan.problem is not None
    plain = build_problem(plan.problem, seed=0)  # no adapters: the original module names
    state = torch.load(tmp_path / "out" / MERGED_WEIGHTS, weights_only=True)
    plain.model.to(torch.bfloat16).load_state_dict(state)
    batch = plain.make_batch(BatchKey(seed=0, step=STEPS + 1, sample_start=0, samples=4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = plain.loss_fn(plain.model, batch).item()
    assert loss == pytest.approx(trained.losses[-1][1], rel=3e-2)


def test_lora_trains_on_fsdp_with_only_the_adapters_in_the_optimizer(train_local: Callable[..., Any]) -> None:
    result = train_local(make_plan().fsdp(3).bf16().peft("lora").steps(STEPS).learning_rate(1e-2))
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < losses[0]
    assert result.facts["optimizer_state_bytes"] == 8 * result.adapter_parameters + 4 * 16


def test_the_saved_adapter_loads_with_the_peft_library_and_gives_the_trained_loss(
    tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    """What a user does with the output: `peft.PeftModel.from_pretrained(base, adapter_dir)` on the
    plain (seeded) base model reproduces the loss of the model memfit trained."""
    import torch
    from memfit_trainer.problems import BatchKey, build_problem
    from peft import PeftModel

    builder = make_plan().precision("fp32").peft("lora").steps(STEPS).learning_rate(1e-2)
    train_local(builder, output_dir=tmp_path / "adapter")
    trained = train_local(builder.steps(STEPS + 1), output_dir=tmp_path / "again")
    plan = builder.build()
    assert plan.problem is not None
    plain = build_problem(plan.problem, seed=0)
    model = PeftModel.from_pretrained(plain.model, str(tmp_path / "adapter"))
    model.eval()
    lora_a = [n for n, _ in model.named_parameters() if "lora_A" in n]
    assert len(lora_a) == 2 * 4  # 2 blocks x qkv, proj, fc, out
    batch = plain.make_batch(BatchKey(seed=0, step=STEPS + 1, sample_start=0, samples=4))
    with torch.no_grad():
        loss = plain.loss_fn(model, batch).item()
        with model.disable_adapter():
            base_loss = plain.loss_fn(model, batch).item()
    assert loss == pytest.approx(trained.losses[-1][1], rel=1e-4)
    assert base_loss != pytest.approx(loss, rel=1e-3)  # the adapter's weights were loaded, not just its shape


@pytest.mark.parametrize("offload", [pytest.param("none", id="zero3"), pytest.param("cpu", id="zero3 offload cpu")])
def test_lora_on_deepspeed_zero3_partitions_the_frozen_base_and_trains_only_the_adapters(
    offload: str, tmp_path: Path, train_local: Callable[..., Any]
) -> None:
    """ZeRO-3 partitions every parameter (the frozen base too), its optimizer owns only the adapters
    (on the host with ZeRO-Offload, DeepSpeedCPUAdam); the adapter saved from the partitions reproduces
    the trained model's loss in a plain model with the same adapters."""
    import torch
    from memfit_trainer.strategies.peft import EVAL_FILE, apply_peft, eval_loss, load_adapter

    builder = make_plan().deepspeed(3).bf16().offload(offload).peft("lora").steps(STEPS).learning_rate(1e-2)
    result = train_local(builder, output_dir=tmp_path / "adapter")
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < losses[0]
    facts = result.facts
    assert facts["zero_stage"] == 3 and facts["offload_optimizer"] == (None if offload == "none" else "cpu")
    assert facts["offload_param"] == (None if offload == "none" else "cpu")
    # The optimizer's state covers the adapters only: Adam m and v over A in fp32 (one flat partition).
    assert result.adapter_parameters == 2 * 8 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    assert facts["optimizer_state_bytes"] >= 8 * result.adapter_parameters
    assert facts["optimizer_state_bytes"] < 8 * result.adapter_parameters + 4096
    if offload == "cpu":
        assert facts["optimizer_class"] == "DeepSpeedCPUAdam"

    plan = builder.build()
    assert plan.problem is not None
    from memfit_trainer.problems import build_problem

    problem = build_problem(plan.problem, seed=0)
    apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=torch.device("cpu"))
    assert load_adapter(problem.model, tmp_path / "adapter") == 4 * 2 * 2
    recorded = json.loads((tmp_path / "adapter" / EVAL_FILE).read_text())
    again = eval_loss(problem, plan.precision, seed=0, step=recorded["step"], device=torch.device("cpu"))
    assert again == pytest.approx(recorded["loss"], rel=2e-2)  # bf16 ZeRO-3 model vs bf16 autocast model
    untrained = build_problem(plan.problem, seed=0)
    apply_peft(untrained, method=plan.peft, adapter=plan.adapter, precision=plan.precision,
               device=torch.device("cpu"))
    before = eval_loss(untrained, plan.precision, seed=0, step=recorded["step"], device=torch.device("cpu"))
    assert abs(before - recorded["loss"]) > 5 * abs(again - recorded["loss"])  # the adapter is what moved it


@pytest.mark.parametrize(("engine", "method"), [pytest.param("deepspeed", "lora", id="lora zero3"),
                                                pytest.param("fsdp", "qlora", id="qlora fsdp")])
def test_a_sharded_peft_run_at_world_size_2_saves_whole_adapter_and_merged_weights(
    engine: str, method: str, tmp_path: Path
) -> None:
    """Two gloo ranks: every rank takes part in gathering the ZeRO-3 partitions or FSDP shards (rank 0
    alone would hang), rank 0 writes the adapter and the merged model, whose whole tensors reproduce
    the trained model's loss (QLoRA on FSDP: the 4-bit weights packed in bf16 and sharded)."""
    import torch
    from memfit_trainer.problems import BatchKey, build_problem
    from memfit_trainer.strategies.peft import (
        ADAPTER_WEIGHTS,
        EVAL_FILE,
        MERGED_WEIGHTS,
        apply_peft,
        eval_loss,
        load_adapter,
    )
    from trainer_support import run_cli

    builder = make_plan().bf16().world(2).peft(method).steps(4).learning_rate(1e-2)
    builder = builder.deepspeed(3) if engine == "deepspeed" else builder.fsdp(3)
    env = {"MEMFIT_OUTPUT_DIR": str(tmp_path / "adapter"), "MEMFIT_SAVE_MERGED": "1"}
    run = run_cli(builder, tmp_path, env=env, timeout_s=300)
    assert run.returncode == 0, run.output[-3000:]
    state = torch.load(tmp_path / "adapter" / ADAPTER_WEIGHTS, weights_only=True)
    assert state["base_model.model.blocks.0.attn.qkv.lora_B.weight"].shape == (192, 8)
    plan = builder.build()
    assert plan.problem is not None
    problem = build_problem(plan.problem, seed=0)
    apply_peft(problem, method=plan.peft, adapter=plan.adapter, precision=plan.precision, device=torch.device("cpu"))
    load_adapter(problem.model, tmp_path / "adapter")
    recorded = json.loads((tmp_path / "adapter" / EVAL_FILE).read_text())
    again = eval_loss(problem, plan.precision, seed=0, step=recorded["step"], device=torch.device("cpu"))
    assert again == pytest.approx(recorded["loss"], rel=2e-2)
    plain = build_problem(plan.problem, seed=0)  # no adapters, no 4-bit layers
    plain.model.to(torch.bfloat16).load_state_dict(torch.load(tmp_path / "adapter" / MERGED_WEIGHTS,
                                                              weights_only=True))
    batch = plain.make_batch(BatchKey(seed=0, step=recorded["step"], sample_start=0, samples=4))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        merged = plain.loss_fn(plain.model, batch).item()
    assert merged == pytest.approx(recorded["loss"], rel=3e-2)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_qlora_on_fsdp_packs_4bit_weights_in_the_flat_dtype_and_trains_like_ddp(
    precision: str, train_local: Callable[..., Any]
) -> None:
    """The FSDP+QLoRA recipe: the 4-bit weights are stored in the base's dtype (quant_storage), so FSDP
    shards and casts them like any parameter, and the layer recovers its quantisation state: the
    losses equal QLoRA on DDP (uint8 storage) step for step."""
    builder = make_plan().precision(precision).peft("qlora").steps(4).learning_rate(1e-2)
    ddp = train_local(builder)
    fsdp = train_local(builder.fsdp(3))
    assert "torch.uint8" in ddp.facts["param_dtypes"]
    assert "torch.uint8" not in fsdp.facts["param_dtypes"]
    assert [loss for _, loss in fsdp.losses] == pytest.approx([loss for _, loss in ddp.losses], rel=1e-3)

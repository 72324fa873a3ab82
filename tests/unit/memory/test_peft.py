"""LoRA/QLoRA memory terms: frozen base bytes, adapter states, frozen-base activations."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, PeftMethod, Precision
from memfit.api.peft import AdapterSettings
from memfit.api.problem import Problem
from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.memory import Shape, Strategy, predict_memory, shape_from_problem
from memfit.memory.activations import activation_terms
from memfit.memory.adapter import AdapterLayout, adapter_layout
from memfit.memory.peft import adapter_parameters, base_bytes, peft_activation_terms
from memfit.memory.strategy import Device

# The accuracy benchmark's GPT (benchmarks/memory_accuracy_cases.py).
GPT = {"builtin": {"kind": "gpt", "layers": 4, "hidden": 256, "heads": 4, "vocab": 2048, "sequenceLength": 256}}
ALL = ["qkv", "proj", "fc", "out"]


def setup(method: PeftMethod, precision: Precision, *, targets: list[str] = ALL, rank: int = 16,
          double_quant: bool = True, ckpt: Checkpointing = Checkpointing.NONE, micro_batch: int = 1
          ) -> tuple[Shape, Strategy, AdapterLayout]:
    problem = Problem.model_validate(GPT)
    shape = Shape.of(shape_from_problem(problem))
    layout = adapter_layout(problem.to_wire(), AdapterSettings(rank=rank, alpha=2 * rank, dropout=0.0,
                                                               target_modules=targets, double_quant=double_quant))
    assert layout is not None
    config = PLAIN_FP32_DDP.model_copy(update={"peft": method, "precision": precision,
                                               "activation_checkpointing": ckpt, "micro_batch_size": micro_batch})
    return shape, Strategy(config=config, device=Device.CPU, adapter=layout), layout


def test_adapter_count_is_rank_times_in_plus_out_per_targeted_layer() -> None:
    shape, _, layout = setup(PeftMethod.LORA, Precision.BF16)
    assert adapter_parameters(shape, layout) == 4 * 16 * ((256 + 768) + (256 + 256) + (256 + 1024) + (1024 + 256))


# Bytes allocated at the start of a step (base + adapters + AdamW state), measured on CPU with the
# allocator counter (memory_accuracy_worker.py): the predicted static bytes are within 0.2 %.
MEASURED_START = {
    "lora fp32": (PeftMethod.LORA, Precision.FP32, True, 20_240_512),
    "lora bf16": (PeftMethod.LORA, Precision.BF16, True, 11_693_184),
    "qlora bf16 nf4 double-quant": (PeftMethod.QLORA, Precision.BF16, True, 7_041_984),
    "qlora fp32 nf4": (PeftMethod.QLORA, Precision.FP32, False, 9_428_096),
}


@pytest.mark.parametrize(("method", "precision", "dq", "measured"), list(MEASURED_START.values()),
                         ids=list(MEASURED_START))
def test_static_bytes_match_the_measured_start_of_a_step(method: PeftMethod, precision: Precision, dq: bool,
                                                          measured: int) -> None:
    shape, strategy, _ = setup(method, precision, double_quant=dq)
    estimate = predict_memory(shape, strategy)
    assert estimate.parameters_bytes + estimate.optimizer_bytes == pytest.approx(measured, rel=2e-3)


def test_qlora_stores_block_linears_in_about_half_a_byte() -> None:
    shape, strategy, layout = setup(PeftMethod.QLORA, Precision.BF16)
    quantised = shape.layers * layout.linear_weights_per_block
    rest = 2 * (shape.parameters - quantised)
    per_weight = (base_bytes(shape, strategy, layout) - rest) / quantised
    assert 0.5 + 1 / 64 < per_weight < 0.5 + 1 / 64 + 0.01  # 4 bits + 8-bit absmax per 64 (+ codes per layer)
    _, no_dq, layout_no_dq = setup(PeftMethod.QLORA, Precision.BF16, double_quant=False)
    assert base_bytes(shape, no_dq, layout_no_dq) > base_bytes(shape, strategy, layout)


def test_a_frozen_base_saves_less_than_a_full_fine_tune_and_untargeted_inputs_are_not_saved() -> None:
    shape, lora, layout = setup(PeftMethod.LORA, Precision.FP32)
    full = activation_terms(shape, Strategy(config=PLAIN_FP32_DDP, device=Device.CPU))
    all_targets = peft_activation_terms(shape, lora, layout)
    assert all_targets.activation_bytes_per_sample < full.activation_bytes_per_sample
    _, lora_qkv, layout_qkv = setup(PeftMethod.LORA, Precision.FP32, targets=["qkv"])
    fewer = peft_activation_terms(shape, lora_qkv, layout_qkv)
    # fc and out inputs (h + f per token and layer, fp32) are no longer saved; 3 fewer A outputs (r each)
    saved = 4 * 4 * 256 * (256 + 1024 + 3 * 16 - 0)
    assert all_targets.activation_bytes_per_sample - fewer.activation_bytes_per_sample == saved


def test_peft_strategy_without_layout_is_refused() -> None:
    shape, strategy, _ = setup(PeftMethod.LORA, Precision.BF16)
    from dataclasses import replace

    with pytest.raises(ValueError, match="adapter layout"):
        predict_memory(shape, replace(strategy, adapter=None))


def test_lora_on_fsdp_shards_base_adapters_gradients_and_optimizer_state() -> None:
    from dataclasses import replace

    from memfit.api.common import Engine

    shape, ddp, _ = setup(PeftMethod.LORA, Precision.BF16)
    fsdp = replace(ddp, config=ddp.config.model_copy(update={"engine": Engine.FSDP, "zero_stage": 3}), world_size=2)
    one, two = predict_memory(shape, ddp), predict_memory(shape, fsdp)
    assert two.parameters_bytes == pytest.approx(one.parameters_bytes / 2, abs=1)
    assert two.optimizer_bytes == pytest.approx(one.optimizer_bytes / 2, abs=1)
    # measured at the start of a step on 2 ranks (CPU allocator): 5,846,664 B per rank
    assert two.parameters_bytes + two.optimizer_bytes == pytest.approx(5_846_664, rel=1e-4)


def _profile_with_peft_points(shape: Shape, strategy: Strategy, *, extra: int) -> object:
    """A CPU profile whose LoRA points are the analytic prediction + `extra` bytes."""
    from memfit.api.profile import Measurement, ModelShape, Profile

    problem = Problem.model_validate(GPT)
    points = []
    for b in (1, 2):
        at = strategy.with_config(micro_batch_size=b, precision=Precision.BF16)
        peak = predict_memory(shape, at).allocated_bytes + extra
        points.append(Measurement(precision=Precision.BF16, checkpointing=Checkpointing.NONE, micro_batch_size=b,
                                  peak_allocated_bytes=peak, step_seconds=0.1, peft=PeftMethod.LORA))
    full = Measurement(precision=Precision.FP32, checkpointing=Checkpointing.NONE, micro_batch_size=1,
                       peak_allocated_bytes=74_916_072, step_seconds=0.1)
    model: ModelShape = shape_from_problem(problem)
    return Profile(problem_hash="x", device="cpu", shape=model, measurements=[full, *points], optimizer="adamw")


@pytest.mark.parametrize("extra", [1 << 20, -(1 << 20)], ids=["model short by 1 MiB", "model over by 1 MiB"])
def test_the_profiles_peft_variant_only_raises_peft_predictions(extra: int) -> None:
    from dataclasses import replace

    from memfit.api.common import Engine
    from memfit.memory import calibrate

    shape, lora, _ = setup(PeftMethod.LORA, Precision.BF16, micro_batch=4)
    profile = _profile_with_peft_points(shape, lora, extra=extra)
    calibration = calibrate(profile, shape)  # type: ignore[arg-type]
    assert len(calibration.peft_points) == 2
    raised = predict_memory(shape, lora, calibration=calibration).allocated_bytes
    assert raised - predict_memory(shape, lora).allocated_bytes == max(0, extra)
    assert calibration.sources(lora)["activations"] == "measured"
    # Not like the profile (FSDP), or another method: analytic.
    fsdp = replace(lora, config=lora.config.model_copy(update={"engine": Engine.FSDP, "zero_stage": 3}))
    assert predict_memory(shape, fsdp, calibration=calibration).allocated_bytes == predict_memory(shape, fsdp).allocated_bytes
    # The full fine-tune's calibration ignores the PEFT points.
    without = profile.model_copy(update={"measurements": profile.measurements[:1]})  # type: ignore[attr-defined]
    full = Strategy(config=PLAIN_FP32_DDP.model_copy(update={"micro_batch_size": 4}), device=Device.CPU)
    assert (predict_memory(shape, full, calibration=calibrate(without, shape)).allocated_bytes
            == predict_memory(shape, full, calibration=calibration).allocated_bytes)

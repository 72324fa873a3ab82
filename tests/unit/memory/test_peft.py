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


def sharded(method: PeftMethod, engine: str, *, world: int, stage: int = 3, offload: str = "none") -> tuple[Shape, Strategy]:
    from memfit.api.common import Engine, Offload

    shape, strategy, layout = setup(method, Precision.BF16)
    config = strategy.config.model_copy(update={"engine": Engine(engine), "zero_stage": stage,
                                                "offload": Offload(offload)})
    return shape, Strategy(config=config, device=Device.CPU, world_size=world, gpus_per_node=world, adapter=layout)


# Bytes allocated when the optimizer step starts (memory_accuracy_worker.py `optimizer_start_bytes`, CPU
# allocator counter, GPT bf16, rank 16 on every block linear): ZeRO-3 holds its partitions, the adapters'
# master, moments, 16-bit gradient partition and a reduce bucket; FSDP the shards, the 4-bit constants
# whole and the sharded adapter gradients.
MEASURED_STEP_START = {
    "lora zero3 w1": (PeftMethod.LORA, "deepspeed", 1, 12_880_909),
    "lora zero3 w2": (PeftMethod.LORA, "deepspeed", 2, 6_537_741),
    "qlora fsdp w1": (PeftMethod.QLORA, "fsdp", 1, 8_108_352),
    "qlora fsdp w2": (PeftMethod.QLORA, "fsdp", 2, 4_096_836),
}


@pytest.mark.parametrize(("method", "engine", "world", "measured"), list(MEASURED_STEP_START.values()),
                         ids=list(MEASURED_STEP_START))
def test_sharded_peft_states_match_the_measured_start_of_the_step(method: PeftMethod, engine: str, world: int,
                                                                   measured: int) -> None:
    from memfit.memory.predict import memory_terms

    shape, strategy = sharded(method, engine, world=world)
    terms = memory_terms(shape, strategy)
    held = terms.static_bytes + (terms.step_gradient_bytes if engine == "fsdp" else 0.0)
    assert held == pytest.approx(measured, rel=1e-2)


def test_zero3_offload_moves_the_adapter_states_to_the_host_on_cuda_only() -> None:
    from dataclasses import replace

    shape, on_cpu = sharded(PeftMethod.LORA, "deepspeed", world=2, offload="cpu")
    cpu = predict_memory(shape, on_cpu)
    cuda = predict_memory(shape, replace(on_cpu, device=Device.CUDA))
    assert cpu.host_bytes == 0 and cpu.optimizer_bytes > 0  # on a CPU device the "host" is the device
    assert cuda.optimizer_bytes == 0 and cuda.parameters_bytes == 0
    assert cuda.host_bytes >= 1.5 * cpu.optimizer_bytes  # DeepSpeed's pinned-buffer factor


def test_qlora_on_fsdp_shards_the_packed_weights_but_not_the_quantisation_constants() -> None:
    from memfit.memory.peft import quantisation_state_bytes

    shape, one = sharded(PeftMethod.QLORA, "fsdp", world=1)
    _, four = sharded(PeftMethod.QLORA, "fsdp", world=4)
    assert one.adapter is not None
    constants = quantisation_state_bytes(shape, one, one.adapter)
    p1, p4 = predict_memory(shape, one).parameters_bytes, predict_memory(shape, four).parameters_bytes
    assert constants > 0
    assert p4 - constants == pytest.approx((p1 - constants) / 4, rel=1e-6, abs=4)


def test_lora_on_zero3_keeps_at_most_the_live_parameter_cap_gathered() -> None:
    """stage3_max_live_parameters bounds what stays gathered between forward and backward, LoRA or not."""
    from memfit.memory.peft_deepspeed import deepspeed_peft_phases
    from memfit.memory.temporaries import DS_MAX_LIVE_PARAMETERS
    from memory_factories import S, model_shape

    huge = Shape.of(model_shape(parameters=70_000_000_000, hidden=8192, heads=64, ffn_hidden=28672, layers=80))
    strategy = S().deepspeed(3).bf16().world(8).build()
    layout = AdapterLayout(rank=16, dropout=False, double_quant=False, groups=((8192, ((8192, True),)),))
    phases = deepspeed_peft_phases(huge, strategy, layout, adapters=80 * 2 * 16 * 8192)
    assert phases.with_activations_bytes == 2.0 * DS_MAX_LIVE_PARAMETERS

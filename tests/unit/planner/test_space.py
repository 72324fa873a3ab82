"""The search space and the pins."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import StrategySpec
from memfit.planner.space import divisors, pinned_fields, strategy_choices


def test_all_auto_space() -> None:
    choices, problems = strategy_choices(StrategySpec())
    assert problems == []
    # engine/stage/offload/8-bit combinations: DDP 2, FSDP 2x3, ZeRO-0 2, ZeRO-1/2 3 each, ZeRO-3 4 = 20,
    # times 3 precisions, 4 checkpointing modes and the chunked loss on or off; plus the optimizer step in
    # backward on DDP (2 optimizer widths) in bf16 and fp32 (never fp16), 4 checkpointing modes, chunked or not.
    # bf16-pure is not in it unless allowed. Activation offload on and off with no and with full checkpointing.
    assert len(choices) == (20 * 12 * 2 + 2 * 2 * 4 * 2) * 3 // 2
    offloading = [c for c in choices if c.config.activation_offload]
    assert len(offloading) == len(choices) // 3
    assert {c.config.activation_checkpointing for c in offloading} == {Checkpointing.NONE, Checkpointing.FULL}
    assert all(c.kept_rank >= 0 and choices[c.kept_rank].config == c.config.model_copy(
        update={"activation_offload": False}) for c in offloading)
    assert not any(c.config.precision == Precision.BF16_PURE for c in choices)
    assert [c.rank for c in choices] == list(range(len(choices)))
    assert len(set(choices)) == len(choices)


def test_activation_offload_is_off_for_a_jobs_own_script_and_a_pin_keeps_one_side() -> None:
    own, _ = strategy_choices(StrategySpec(), own_script=True)
    assert own and not any(c.config.activation_offload for c in own)
    pinned, _ = strategy_choices(StrategySpec.model_validate({"activationOffload": "enabled"}))
    assert pinned and all(c.config.activation_offload for c in pinned)
    # A pin runs offload with every checkpointing mode; auto tries it with none and full only.
    assert {c.config.activation_checkpointing for c in pinned} == set(Checkpointing) - {Checkpointing.AUTO}


def test_pure_bf16_only_when_allowed_and_never_on_deepspeed_or_with_offload() -> None:
    choices, _ = strategy_choices(StrategySpec.model_validate({"allowPureBf16": True}))
    pure = [c for c in choices if c.config.precision == Precision.BF16_PURE]
    assert pure and {c.config.engine for c in pure} == {Engine.DDP, Engine.FSDP}
    assert not any(c.config.offload != Offload.NONE for c in pure)
    assert any(c.config.optimizer8bit for c in pure)  # bitsandbytes updates bf16 weights in place


def test_chunked_loss_needs_a_language_model_head() -> None:
    choices, _ = strategy_choices(StrategySpec(), lm_head=False)
    assert choices and not any(c.config.chunked_loss for c in choices)
    none, problems = strategy_choices(StrategySpec.model_validate({"chunkedLoss": "enabled"}), lm_head=False)
    assert none == [] and "strategy.chunkedLoss" in problems[0]


def test_optimizer_in_backward_only_on_ddp_without_fp16() -> None:
    choices, _ = strategy_choices(StrategySpec.model_validate({"optimizerInBackward": "enabled"}))
    assert choices and all(c.config.engine == Engine.DDP and c.config.precision != Precision.FP16 for c in choices)


PINS = {
    "stage 1 means DeepSpeed": ({"zeroStage": 1}, lambda c: c.config.engine == Engine.DEEPSPEED and c.config.zero_stage == 1),
    "nvme means ZeRO-3": ({"offload": "nvme"}, lambda c: (c.config.engine, c.config.zero_stage) == (Engine.DEEPSPEED, 3)),
    "fp16 only": ({"precision": "fp16"}, lambda c: c.config.precision == Precision.FP16),
    "8-bit disables offload": ({"optimizer8bit": "enabled"}, lambda c: c.config.optimizer8bit and c.config.offload == Offload.NONE),
}


@pytest.mark.parametrize(("pins", "check"), PINS.values(), ids=PINS.keys())
def test_pins_restrict_the_space(pins: dict[str, object], check: object) -> None:
    choices, _ = strategy_choices(StrategySpec.model_validate(pins))
    assert choices and all(check(c) for c in choices)  # type: ignore[operator]


def test_pins_that_leave_nothing_explain_why() -> None:
    pins = StrategySpec.model_validate({"engine": "fsdp", "zeroStage": 1})
    choices, problems = strategy_choices(pins)
    assert choices == []
    assert problems == ["the pinned strategy cannot run: FSDP shards at stage 2 (grad-op) or 3 (full shard), not 1"]


def test_divisors() -> None:
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    assert divisors(1) == (1,)


PINNED_FIELDS: dict[str, tuple[dict[str, object], dict[str, str]]] = {
    "nothing pinned": ({}, {}),
    "precision and offload": ({"precision": "bf16", "offload": "nvme"},
                              {"strategy.precision": "bf16", "strategy.offload": "nvme"}),
    "engine and stage": ({"engine": "deepspeed", "zeroStage": 2},
                         {"strategy.engine": "deepspeed", "strategy.zeroStage": "2"}),
    "QLoRA alone pins its compute dtype": ({"peft": {"method": "qlora", "qlora": {"computeDtype": "bf16"}}},
                                           {"strategy.peft.qlora.computeDtype": "bf16"}),
    "QLoRA beside a full fine-tune does not": (
        {"peft": {"method": "auto", "allowed": ["none", "qlora"], "qlora": {"computeDtype": "bf16"}}}, {}),
}


@pytest.mark.parametrize(("strategy", "expected"), PINNED_FIELDS.values(), ids=PINNED_FIELDS.keys())
def test_pinned_fields_by_path(strategy: dict[str, object], expected: dict[str, str]) -> None:
    assert pinned_fields(StrategySpec.model_validate(strategy)) == expected

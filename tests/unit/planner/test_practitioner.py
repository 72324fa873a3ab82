"""The practitioner baseline: the 20 B/param rule picks a GPU, then the escalation until memfit's model fits."""

from __future__ import annotations

from typing import Any

import pytest
from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.catalog import CATALOG
from memfit.planner import plan, resolve_offers, resolve_shape, search_context
from memfit.planner.context import SearchContext
from memfit.planner.practitioner import practitioner_baseline, rule_bytes, setup_words
from memfit.planner.result import BaselineResult
from planner_factories import (
    LLAMA_1B_CONFIG,
    LLAMA_7B_CONFIG,
    LLAMA_70B_CONFIG,
    JobBuilder,
    make_job,
    make_pool,
)

QWEN_05B_CONFIG = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True}
A100_NODE = {"per_node": 8, "host_gib": 1152}


def context(spec: MemoryOptimizedTrainingJobSpec) -> SearchContext:
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    return search_context(spec, shape)


def practitioner(job: JobBuilder, pools: list[GPUNodePool]) -> BaselineResult | None:
    spec = job.build()
    offers, rejections = resolve_offers(pools, catalog=CATALOG)
    assert not rejections
    return practitioner_baseline(context(spec), offers, pins=spec.strategy)


ESCALATIONS: dict[str, tuple[JobBuilder, list[GPUNodePool], str, list[str]]] = {
    # 0.5B: the rule (9.2 GiB) picks the T4; plain fp16 DDP needs 18.5 GiB there, checkpointing fits.
    "needs checkpointing": (
        make_job().hf(QWEN_05B_CONFIG).batch(64),
        [make_pool("t4", "t4"), make_pool("l40s", "l40s")],
        "fp16 DDP + full checkpointing on 1x1 Tesla-T4 (t4)",
        ["plain fp16 DDP on 1x1 Tesla-T4 (t4): does not fit"],
    ),
    # A small model at 32k tokens: activations outgrow the T4 and the L4 even with checkpointing.
    "needs a bigger GPU": (
        make_job().gpt(layers=4, hidden=256, heads=4, vocab=50257, sequenceLength=32768).batch(8),
        [make_pool("t4", "t4"), make_pool("l4", "l4"), make_pool("l40s", "l40s")],
        "plain bf16 DDP on 1x1 NVIDIA-L40S (l40s)",
        ["plain fp16 DDP on 1x1 Tesla-T4 (t4): does not fit",
         "fp16 DDP + full checkpointing on 1x1 Tesla-T4 (t4): does not fit",
         "plain bf16 DDP on 1x1 NVIDIA-L4 (l4): does not fit",
         "bf16 DDP + full checkpointing on 1x1 NVIDIA-L4 (l4): does not fit"],
    ),
    # 7B: 125 GiB by the rule, no single GPU holds it: FSDP on whole nodes of the biggest GPU at once.
    "needs FSDP": (
        make_job().hf(LLAMA_7B_CONFIG).batch(64).max_nodes(2),
        [make_pool("l4", "l4"), make_pool("a100-80", "a100-80", **A100_NODE)],
        "bf16 FSDP full shard on 1x8 NVIDIA-A100-SXM4-80GB (a100-80)",
        [],
    ),
    # 70B on at most two A100 nodes: sharding and checkpointing are not enough, CPU offload is.
    "needs CPU offload": (
        make_job().hf(LLAMA_70B_CONFIG, seq=4096).batch(64).max_nodes(2),
        [make_pool("a100-80", "a100-80", max_nodes=2, **A100_NODE)],
        "bf16 FSDP full shard + full checkpointing + CPU offload on 2x8 NVIDIA-A100-SXM4-80GB (a100-80)",
        ["bf16 FSDP full shard on 2x8 NVIDIA-A100-SXM4-80GB (a100-80): does not fit",
         "bf16 FSDP full shard + full checkpointing on 2x8 NVIDIA-A100-SXM4-80GB (a100-80): does not fit"],
    ),
}


@pytest.mark.parametrize("case", list(ESCALATIONS), ids=list(ESCALATIONS))
def test_escalates_until_memfits_model_says_it_fits(case: str) -> None:
    job, pools, label, trail = ESCALATIONS[case]
    base = practitioner(job, pools)
    assert base is not None and base.fits
    assert base.label == label
    assert len(base.escalation) == len(trail)
    for step, expected in zip(base.escalation, trail, strict=True):
        assert step.startswith(expected), step
    assert base.peak_bytes * 1.1 <= base.usable_bytes  # the plan's fit rule, default 10 % headroom
    assert base.total_cost == pytest.approx(base.hours * base.price_per_hour)
    assert "B/param rule of thumb" in base.note


def test_rule_is_20_bytes_per_parameter_for_mixed_precision_adamw() -> None:
    ctx = context(make_job().hf(LLAMA_1B_CONFIG).build())
    p = ctx.shape.parameters
    assert rule_bytes(ctx, make_job().build().strategy) == pytest.approx(20 * p)
    fp32 = make_job().pin(precision="fp32").build().strategy
    assert rule_bytes(ctx, fp32) == pytest.approx(20 * p)  # 4 + 4 + 8, the same 16 B of states
    eight_bit = make_job().pin(optimizer8bit="enabled").build().strategy
    assert rule_bytes(ctx, eight_bit) == pytest.approx((8 + 2 * (1 + 4 / 256)) * 1.25 * p)
    sgd = context(make_job().hf(LLAMA_1B_CONFIG).optimizer("sgd").build())
    assert rule_bytes(sgd, make_job().build().strategy) == pytest.approx(12 * 1.25 * p)


def test_cheapest_gpu_per_gpu_hour_holding_the_rule_spot_allowed() -> None:
    # 1B: 23 GiB by the rule: not an L4 (22.5 GiB); of the L40S pools the spot one is cheaper per GPU-hour,
    # and an 8-GPU A100 node is dearer per GPU.
    pools = [make_pool("l4", "l4"), make_pool("l40s", "l40s", price=1.86),
             make_pool("l40s-spot", "l40s", price=0.9, capacityType="spot"),
             make_pool("a100-80", "a100-80", **A100_NODE)]
    base = practitioner(make_job().hf(LLAMA_1B_CONFIG).batch(64), pools)
    assert base is not None and base.pool == "l40s-spot" and base.escalation == ()


def test_pinned_fp32_job_is_compared_with_fp32() -> None:
    spec = make_job().hf(QWEN_05B_CONFIG).batch(64).pin(precision="fp32").build()
    pools = [make_pool("l4", "l4"), make_pool("a100-80", "a100-80", **A100_NODE)]
    result = plan(spec, pools=pools, catalog=CATALOG)
    base, chosen = result.baseline, result.chosen
    assert base is not None and chosen is not None and base.config is not None
    assert base.config.precision == Precision.FP32 and base.label.startswith("plain fp32 DDP")
    assert chosen.strategy.config.precision == Precision.FP32
    assert result.savings_percent == pytest.approx(100 * (1 - chosen.total_cost / base.total_cost))
    unpinned = plan(make_job().hf(QWEN_05B_CONFIG).batch(64).build(), pools=pools, catalog=CATALOG).baseline
    assert unpinned is not None and unpinned.config is not None and unpinned.config.precision == Precision.BF16


PINS: dict[str, tuple[dict[str, Any], str]] = {
    "engine deepspeed shards with ZeRO-3": ({"engine": "deepspeed"}, "bf16 DeepSpeed ZeRO-3 on 1x8 "),
    "checkpointing pinned on every rung": ({"activationCheckpointing": "selective"},
                                           "bf16 FSDP full shard + selective checkpointing on 1x8 "),
    "8-bit optimizer pinned": ({"optimizer8bit": "enabled"}, "bf16 FSDP full shard + 8-bit optimizer on 1x8 "),
}


@pytest.mark.parametrize("case", list(PINS), ids=list(PINS))
def test_pins_hold_on_every_rung(case: str) -> None:
    pins, prefix = PINS[case]
    base = practitioner(make_job().hf(LLAMA_7B_CONFIG).batch(64).pin(**pins),
                        [make_pool("a100-80", "a100-80", **A100_NODE)])
    assert base is not None and base.label.startswith(prefix), base.label


def test_pinned_ddp_never_shards() -> None:
    base = practitioner(make_job().hf(LLAMA_7B_CONFIG).batch(64).pin(engine="ddp"),
                        [make_pool("a100-80", "a100-80", **A100_NODE)])
    assert base is None  # 7B plain DDP needs more than 80 GiB; the pin forbids FSDP


def test_no_rung_fits_anywhere_gives_none_and_the_message_says_so() -> None:
    assert practitioner(make_job().hf(LLAMA_70B_CONFIG).batch(8), [make_pool("t4", "t4", max_nodes=1)]) is None
    result = plan(make_job().hf(LLAMA_7B_CONFIG).batch(8).pin(engine="deepspeed", offload="nvme").build(),
                  pools=[make_pool("t4", "t4", max_nodes=1, host_gib=16, nvme_gib=0)], catalog=CATALOG)
    assert result.baseline is None


def test_words_name_each_escalation_step() -> None:
    fsdp = PLAIN_FP32_DDP.model_copy(update={"engine": Engine.FSDP, "zero_stage": 3, "precision": Precision.BF16})
    assert setup_words(PLAIN_FP32_DDP) == "plain fp32 DDP"
    assert setup_words(fsdp.model_copy(update={"activation_checkpointing": Checkpointing.FULL,
                                                     "offload": Offload.CPU})) == (
        "bf16 FSDP full shard + full checkpointing + CPU offload")

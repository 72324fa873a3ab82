"""The practitioner baseline: what someone without a planner runs, escalating until the job fits.

The rule of thumb: mixed-precision AdamW needs about 20 bytes per parameter. 16 B are model states,
2 B 16-bit weights + 2 B 16-bit gradients + 12 B fp32 master weights, momentum and variance (ZeRO
paper, Rajbhandari et al. 2020, §3: "2Ψ + 2Ψ + KΨ" with K = 12; EleutherAI "Transformer Math 101"
counts the same 16 B; the Hugging Face Transformers docs, "Model training anatomy", 18 B with fp32
gradients); about a quarter more covers activations and buffers. The job's optimizer and a pinned
precision change the 16 B (fp32 AdamW 4 + 4 + 8; SGD with momentum one 4 B state; 8-bit AdamW 2 B of
state, Dettmers et al. 2022); the quarter stays.

The practitioner picks the cheapest GPU per GPU-hour (spot allowed) whose memory holds that, then
climbs until a rung fits, each judged by memfit's own model (`baseline.setup_baseline`: the plan's fit
rule `ctx.fits_gpu` on the predicted peak, host RAM for offload, the same step time and prices):
1. plain DDP, bf16 autocast (fp16 without bf16), on one node of that pool;
2. + full activation checkpointing;
3. the next bigger GPU (the cheapest per GPU-hour with more memory), rungs 1-2 again, to the largest;
4. FSDP full shard on whole nodes of the GPU the ladder ends at (the most memory per GPU, the cheapest
   per GPU-hour of those), on the fewest nodes whose GPUs hold the rule's bytes spread over them;
5. + full checkpointing, then more nodes (to the pool's and the job's maxNodes);
6. + CPU offload, from rung 4's node count up;
then rungs 4-6 on the next pool by memory per GPU. None when no rung fits anywhere.

Layouts: on one node the practitioner uses the largest part of it memfit's layouts allow (1/2/4/...
GPUs of a bigger node, priced pro rata as `offers.Layout` prices them; the whole node when its GPU count
splits the global batch); FSDP rents whole nodes. The job's pins hold on every rung: a pinned precision
(fp32 too), engine, ZeRO stage, checkpointing, offload, 8-bit optimizer, micro-batch and PEFT method
replace the rung's own, and a rung the pins make invalid is skipped. The job's cost and deadline
limits are memfit's to honour, not the practitioner's: they are not applied.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from memfit.api.common import (
    Checkpointing,
    Engine,
    Offload,
    OptimizerImplementation,
    PeftMethod,
    Precision,
    Toggle,
)
from memfit.api.job import OptimizerKind, StrategySpec
from memfit.api.training_config import PLAIN_FP32_DDP, TrainingConfig
from memfit.memory.states import optimizer_state_bytes_per_param
from memfit.memory.strategy import Strategy, strategy_problem
from memfit.planner.baseline import TermsMemo, setup_baseline
from memfit.planner.context import SearchContext
from memfit.planner.explain import gib
from memfit.planner.offers import Layout, Offer
from memfit.planner.result import BaselineResult

# Activations and buffers on top of the model states: 16 B x 1.25 = the rule's 20 B/param.
RULE_MARGIN = 1.25
# Bytes per parameter of a frozen LoRA base (16-bit) and a QLoRA base (4-bit NF4, Dettmers et al. 2023).
LORA_BASE_BYTES, QLORA_BASE_BYTES = 2.0, 0.5
PLAIN_DDP = PLAIN_FP32_DDP.model_copy(update={"precision": Precision.BF16})
FSDP_FULL_SHARD = PLAIN_DDP.model_copy(update={"engine": Engine.FSDP, "zero_stage": 3})
# The sharded engines' full-shard stage (a pinned engine keeps the rung's sharding).
FULL_SHARD_STAGE = {Engine.DDP: 0, Engine.FSDP: 3, Engine.DEEPSPEED: 3}


@dataclass(frozen=True, slots=True)
class Rung:
    """One setup the practitioner tries: a configuration on a layout of a pool."""

    offer: Offer
    config: TrainingConfig
    layout: Layout


def rule_bytes(ctx: SearchContext, pins: StrategySpec) -> float:
    """The rule of thumb's memory for the job (see the module docstring), in bytes."""
    method = practitioner_peft(ctx, pins)
    precision = _rule_precision(pins)
    mixed = precision != Precision.FP32
    eight_bit = pins.optimizer8bit == Toggle.ENABLED
    states = optimizer_state_bytes_per_param(ctx.optimizer, eight_bit=eight_bit)
    # 16-bit weights and gradients plus an fp32 master copy, or fp32 weights and gradients; a pinned
    # bf16-pure has no master copy and keeps 32-bit optimizer state in bf16.
    per_trained = (2 + 2 + 4 + states) if mixed else (4 + 4 + states)
    if precision == Precision.BF16_PURE:
        per_trained = 2 + 2 + (states if eight_bit else states / 2)
    parameters = float(ctx.shape.parameters)
    if method == PeftMethod.NONE or ctx.adapter is None:
        return per_trained * parameters * RULE_MARGIN
    adapters = float(ctx.shape.layers * ctx.adapter.adapter_parameters_per_block)
    base = QLORA_BASE_BYTES if method == PeftMethod.QLORA else LORA_BASE_BYTES
    return (base * parameters + per_trained * adapters) * RULE_MARGIN


def practitioner_baseline(ctx: SearchContext, offers: Sequence[Offer], *,
                          pins: StrategySpec) -> BaselineResult | None:
    """The first rung that fits (its `escalation` lists the rungs before it and why each was left), or
    None when no rung fits any pool."""
    need = rule_bytes(ctx, pins)
    memo: TermsMemo = {}
    seen: set[tuple[object, ...]] = set()
    trail: list[str] = []
    for rung in rungs(ctx, offers, pins, need=need):
        key = (rung.offer.pool, rung.config.key(), rung.layout.world_size, rung.layout.nodes)
        if key in seen:
            continue
        seen.add(key)
        layout = rung.layout
        label = (f"{setup_words(rung.config)} on {layout.nodes}x{layout.gpus_per_node} {rung.offer.product} "
                 f"({rung.offer.pool})")
        result = setup_baseline(ctx, rung.offer, rung.config, world_size=layout.world_size,
                                gpus_per_node=layout.gpus_per_node, nodes=layout.nodes,
                                price_per_hour=layout.price_per_hour, label=label, memo=memo)
        if result.fits:
            per_param = need / max(ctx.shape.parameters, 1)
            note = f"practitioner: {per_param:.0f} B/param rule of thumb = {gib(need)}" + (
                f"; escalated past {len(trail)} setups that do not fit" if trail else "")
            return replace(result, note="; ".join(filter(None, [note, result.note])), escalation=tuple(trail))
        trail.append(f"{label}: {result.note}")
    return None


def rungs(ctx: SearchContext, offers: Sequence[Offer], pins: StrategySpec, *, need: float) -> Iterator[Rung]:
    """The practitioner's ladder in order (pins applied; rungs they make invalid left out)."""
    peft = practitioner_peft(ctx, pins)
    checkpointed = {"activation_checkpointing": Checkpointing.FULL}
    by_price = sorted(offers, key=lambda o: (o.price_per_node_hour / o.gpus_per_node, o.pool))
    gpu = next((o for o in by_price if o.usable_bytes >= need), None)
    while gpu is not None:
        layout = _one_node(ctx, gpu)
        if layout is not None:
            for template in (PLAIN_DDP, PLAIN_DDP.model_copy(update=checkpointed)):
                yield from _rung(gpu, template, layout, pins, peft)
        current = gpu
        gpu = next((o for o in by_price if o.usable_bytes > current.usable_bytes), None)
    offload = {**checkpointed, "offload": Offload.CPU}
    for offer, start in _sharding_order(ctx, by_price, need):
        nodes = _whole_nodes(ctx, offer)
        first = nodes.index(start)
        yield from _rung(offer, FSDP_FULL_SHARD, start, pins, peft)
        for layout in nodes[first:]:
            yield from _rung(offer, FSDP_FULL_SHARD.model_copy(update=checkpointed), layout, pins, peft)
        for layout in nodes[first:]:
            yield from _rung(offer, FSDP_FULL_SHARD.model_copy(update=offload), layout, pins, peft)


def practitioner_peft(ctx: SearchContext, pins: StrategySpec) -> PeftMethod:
    """A full fine-tune when the job allows one (or the adapters' layout is unknown), else the first
    PEFT method it allows."""
    methods = pins.peft.methods()
    if PeftMethod.NONE in methods or ctx.adapter is None or not methods:
        return PeftMethod.NONE
    return methods[0]


def setup_words(config: TrainingConfig) -> str:
    """`plain bf16 DDP`, `bf16 FSDP full shard + full checkpointing + CPU offload`, `LoRA bf16 DDP`."""
    if config.engine == Engine.DEEPSPEED:
        engine = f"DeepSpeed ZeRO-{config.zero_stage}"
    elif config.engine == Engine.FSDP:
        engine = "FSDP full shard" if config.zero_stage == 3 else "FSDP grad-op shard"
    else:
        engine = "DDP"
    extras = [f"{config.activation_checkpointing.value} checkpointing"
              if config.activation_checkpointing != Checkpointing.NONE else "",
              {Offload.CPU: "CPU offload", Offload.NVME: "NVMe offload"}.get(config.offload, ""),
              "8-bit optimizer" if config.optimizer8bit else ""]
    head = f"{config.precision.value} {engine}"
    if config.peft != PeftMethod.NONE:
        head = f"{'QLoRA' if config.peft == PeftMethod.QLORA else 'LoRA'} {head}"
    elif config.engine == Engine.DDP and not any(extras):
        head = f"plain {head}"
    return " + ".join([head, *filter(None, extras)])


def _rung(offer: Offer, template: TrainingConfig, layout: Layout, pins: StrategySpec,
          peft: PeftMethod) -> Iterator[Rung]:
    config = with_pins(template, pins, offer=offer, peft=peft)
    if config is not None:
        yield Rung(offer, config, layout)


def with_pins(template: TrainingConfig, pins: StrategySpec, *, offer: Offer,
              peft: PeftMethod = PeftMethod.NONE) -> TrainingConfig | None:
    """The rung's configuration with the job's pinned fields in place of its own, on `offer` (None when
    the pins and the rung cannot run together, or the GPU lacks a pinned bf16)."""
    precision = _rule_precision(pins)
    if precision == Precision.AUTO:
        precision = Precision.BF16 if offer.supports_bf16 else Precision.FP16
    elif precision in (Precision.BF16, Precision.BF16_PURE) and not offer.supports_bf16:
        return None
    engine = template.engine if pins.engine == Engine.AUTO else pins.engine
    if pins.engine == Engine.AUTO and pins.offload == Offload.NVME and template.engine != Engine.DDP:
        engine = Engine.DEEPSPEED  # NVMe offload is DeepSpeed ZeRO-3's (ZeRO-Infinity)
    if engine == template.engine:
        stage = template.zero_stage
    elif template.engine == Engine.DDP:
        stage = 0 if engine == Engine.DEEPSPEED else 3  # DeepSpeed's stage 0 is plain data parallel; FSDP has none
    else:
        stage = FULL_SHARD_STAGE[engine]
    if pins.zero_stage != "auto":
        stage = int(pins.zero_stage)
    config = template.model_copy(update={
        "precision": precision, "engine": engine, "zero_stage": stage, "peft": peft,
        "activation_checkpointing": template.activation_checkpointing
        if pins.activation_checkpointing == Checkpointing.AUTO else pins.activation_checkpointing,
        "offload": template.offload if pins.offload == Offload.AUTO else pins.offload,
        "optimizer8bit": pins.optimizer8bit == Toggle.ENABLED,
        # What the user pinned on, the practitioner runs too (its rungs where it cannot run are left out).
        "optimizer_in_backward": pins.optimizer_in_backward == Toggle.ENABLED,
        "chunked_loss": pins.chunked_loss == Toggle.ENABLED,
        "activation_offload": pins.activation_offload == Toggle.ENABLED,
        # The library's default step unless pinned (a pin the optimizer cannot take leaves the rung out).
        "optimizer_implementation": None if pins.optimizer_implementation == OptimizerImplementation.AUTO
        else pins.optimizer_implementation,
    })
    return config if strategy_problem(Strategy(config=config, optimizer=OptimizerKind.ADAMW)) is None else None


def _rule_precision(pins: StrategySpec) -> Precision:
    """The pinned precision, else QLoRA's pinned compute dtype when QLoRA is the only method, else auto."""
    compute = pins.peft.qlora.compute_dtype
    if pins.precision == Precision.AUTO and pins.peft.methods() == (PeftMethod.QLORA,):
        return compute
    return pins.precision


def _splits(ctx: SearchContext, world_size: int) -> bool:
    """The global batch (and a pinned micro-batch) splits over `world_size` ranks."""
    if ctx.per_gpu(world_size) is None:
        return False
    return ctx.pinned_micro_batch is None or ctx.accumulation(world_size, ctx.pinned_micro_batch) is not None


def _one_node(ctx: SearchContext, offer: Offer) -> Layout | None:
    """The largest single-node layout whose GPU count splits the batch."""
    fitting = [lay for lay in offer.layouts(ctx.max_nodes) if lay.nodes == 1 and _splits(ctx, lay.world_size)]
    return max(fitting, key=lambda lay: lay.world_size, default=None)


def _whole_nodes(ctx: SearchContext, offer: Offer) -> list[Layout]:
    """Whole-node layouts, fewest nodes first, whose GPU count splits the batch."""
    return [lay for lay in offer.layouts(ctx.max_nodes)
            if lay.gpus_per_node == offer.gpus_per_node and _splits(ctx, lay.world_size)]


def _sharding_order(ctx: SearchContext, offers: Sequence[Offer], need: float) -> list[tuple[Offer, Layout]]:
    """Pools for FSDP, where the GPU ladder ends (most memory per GPU first, then the cheapest per
    GPU-hour), each with the node count to start at: the fewest whole nodes whose GPUs hold the rule's
    bytes spread over them (the most it has when none do)."""
    ordered = sorted(offers, key=lambda o: (-o.usable_bytes, o.price_per_node_hour / o.gpus_per_node, o.pool))
    out: list[tuple[Offer, Layout]] = []
    for offer in ordered:
        nodes = _whole_nodes(ctx, offer)
        if nodes:
            start = next((lay for lay in nodes if need / lay.world_size <= offer.usable_bytes), nodes[-1])
            out.append((offer, start))
    return out

"""The search space: every valid (engine, stage, precision, checkpointing, offload, 8-bit, optimizer in
backward, chunked loss, activation offload) choice that honours the job's pinned strategy fields, in a fixed preference
order used to break ties. bf16-pure is in it only when the job allows it (`allowPureBf16`) or pins it.

The optimizer implementation is not searched: where it can be chosen (a 32-bit torch or DeepSpeed GPU
step), `fused` needs no temporaries and moves the fewest bytes, so it is never worse than foreach or the
per-tensor loop in memory or time (tests/unit/planner/test_optimizer_implementation.py); `auto` is
`fused` there, a pin is taken as it is.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import NamedTuple

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
from memfit.api.training_config import PLAIN_FP32_DDP, TrainingConfig, optimizer_implementation_problem
from memfit.memory.adapter import AdapterLayout
from memfit.memory.strategy import Strategy, strategy_problem

# Preference order for ties (simpler and more common first).
ENGINES = (Engine.DDP, Engine.DEEPSPEED, Engine.FSDP)
STAGES = {Engine.DDP: (0,), Engine.FSDP: (2, 3), Engine.DEEPSPEED: (0, 1, 2, 3)}
PRECISIONS = (Precision.BF16, Precision.FP16, Precision.FP32, Precision.BF16_PURE)
CHECKPOINTING = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.SELECTIVE_OP, Checkpointing.FULL)
OFFLOADS = (Offload.NONE, Offload.CPU, Offload.NVME)


@dataclass(frozen=True, slots=True)
class Choice:
    """A training configuration without its layout (world size) and batch split (kept at 1x1)."""

    config: TrainingConfig
    rank: int  # position in the preference order (lower wins a tie)
    memory_id: int = -1  # equal for choices with identical memory (bf16 and fp16 twins)
    twin_id: int = -1  # equal for a 32-bit choice and its 8-bit twin
    unchunked_rank: int = -1  # a chunked-loss choice: the rank of the same choice without it (-1: none)
    kept_rank: int = -1  # an activation-offload choice: the rank of the same choice keeping its activations

    def strategy(self, *, optimizer: OptimizerKind, world_size: int = 1, gpus_per_node: int = 1,
                 micro_batch_size: int = 1, accumulation_steps: int = 1,
                 adapter: AdapterLayout | None = None) -> Strategy:
        """The concrete Strategy at a layout and batch split (`adapter`: the LoRA/QLoRA layout, used
        only by a PEFT choice)."""
        config = self.config
        if (micro_batch_size, accumulation_steps) != (1, 1):
            config = config.model_copy(update={
                "micro_batch_size": micro_batch_size, "gradient_accumulation_steps": accumulation_steps,
            })
        return Strategy(config=config, optimizer=optimizer, world_size=world_size, gpus_per_node=gpus_per_node,
                        adapter=adapter if config.peft != PeftMethod.NONE else None)

    def describe(self) -> str:
        """`ZeRO-3 bf16 ckpt-full offload-cpu 8-bit-optim`."""
        return self.config.describe(batch=False)


def choice(engine: Engine, zero_stage: int, precision: Precision, checkpointing: Checkpointing,
           offload: Offload, optimizer8bit: bool, *, rank: int, memory_id: int = -1, twin_id: int = -1,
           peft: PeftMethod = PeftMethod.NONE, optimizer_in_backward: bool = False,
           chunked_loss: bool = False, optimizer_implementation: OptimizerImplementation | None = None,
           activation_offload: bool = False) -> Choice:
    """A Choice from its configuration fields (micro-batch and accumulation 1)."""
    config = PLAIN_FP32_DDP.model_copy(update={
        "engine": engine, "zero_stage": zero_stage, "precision": precision,
        "activation_checkpointing": checkpointing, "offload": offload, "optimizer8bit": optimizer8bit,
        "peft": peft, "optimizer_in_backward": optimizer_in_backward, "chunked_loss": chunked_loss,
        "optimizer_implementation": optimizer_implementation, "activation_offload": activation_offload,
    })
    return Choice(config, rank, memory_id, twin_id)


def implementation_for(pin: OptimizerImplementation | None, *, precision: Precision, offload: Offload,
                       optimizer8bit: bool) -> OptimizerImplementation | None:
    """The implementation a choice runs: a pin as it is (`strategy_problem` refuses it where the optimizer
    has its own kernels); `auto`: fused where it can be chosen, else unset; None (a job's own optimizer):
    unset."""
    if pin is None or pin != OptimizerImplementation.AUTO:
        return pin
    why = optimizer_implementation_problem(precision=precision, offload=offload, optimizer8bit=optimizer8bit)
    return OptimizerImplementation.FUSED if why is None else None


def _allowed(pin: object, values: tuple[object, ...], auto: object) -> tuple[object, ...]:
    return values if pin == auto else tuple(v for v in values if v == pin)


def strategy_choices(pins: StrategySpec, *, lm_head: bool = True,
                     own_script: bool = False) -> tuple[list[Choice], list[str]]:
    """Valid choices under the pins, in preference order, and why none exist when the list is empty.

    Only the PEFT methods the job allows (`strategy.peft`) are in the space: a full fine-tune is never
    turned into LoRA/QLoRA, nor the reverse, unless the user allowed it. QLoRA's `computeDtype` pins
    the precision of its choices. Chunked loss is in it only for a model with a language-model head
    (`lm_head`). A job's own script (`own_script`) steps its own optimizer: its implementation is left unset,
    the library's default; and it is never asked for selective-op checkpointing, memfit_trainer's per-op
    policy (pins of either are refused at validation, memfit.api.technique_rules).
    """
    if not lm_head and pins.chunked_loss == Toggle.ENABLED:
        return [], ["the pinned strategy cannot run: strategy.chunkedLoss enabled needs a language-model head "
                    "(a builtin gpt or bert, or a Hugging Face causal LM); set it to auto or disabled"]
    # The micro-batch is not part of a choice; the pins enter as plain (hashable) values.
    chunked = pins.chunked_loss if lm_head else Toggle.DISABLED
    pinned = Pins(pins.engine, pins.precision, pins.activation_checkpointing, pins.zero_stage, pins.offload,
                  pins.optimizer8bit, pins.peft.methods(), pins.peft.qlora.compute_dtype, pins.allow_pure_bf16,
                  pins.optimizer_in_backward, chunked, None if own_script else pins.optimizer_implementation,
                  Toggle.DISABLED if own_script else pins.activation_offload)
    choices, problems = _choices(pinned)
    if own_script and pins.activation_checkpointing == Checkpointing.AUTO:
        choices = tuple(c for c in choices if c.config.activation_checkpointing != Checkpointing.SELECTIVE_OP)
    return list(choices), list(problems)


def pinned_fields(pins: StrategySpec) -> dict[str, str]:
    """The strategy fields the job pinned (not auto), by field path (`strategy.precision` -> `bf16`), for
    the reasons that name them; QLoRA's `computeDtype` when QLoRA is the only method allowed (then it
    pins the precision of every choice)."""
    fields = {"engine": pins.engine, "precision": pins.precision, "activationCheckpointing":
              pins.activation_checkpointing, "zeroStage": pins.zero_stage, "offload": pins.offload,
              "optimizer8bit": pins.optimizer8bit, "optimizerInBackward": pins.optimizer_in_backward,
              "chunkedLoss": pins.chunked_loss, "optimizerImplementation": pins.optimizer_implementation,
              "activationOffload": pins.activation_offload}
    out = {f"strategy.{key}": str(value) for key, value in fields.items() if value != "auto"}
    compute = pins.peft.qlora.compute_dtype
    if pins.peft.methods() == (PeftMethod.QLORA,) and compute != Precision.AUTO:
        out["strategy.peft.qlora.computeDtype"] = compute.value
    return out


class Pins(NamedTuple):
    """The strategy fields that shape the space, hashable (the cache key of `_choices`)."""

    engine: Engine
    precision: Precision
    checkpointing: Checkpointing
    zero_stage: int | str
    offload: Offload
    optimizer8bit: Toggle
    methods: tuple[PeftMethod, ...]
    qlora_compute: Precision
    allow_pure_bf16: bool
    optimizer_in_backward: Toggle
    chunked_loss: Toggle
    optimizer_implementation: OptimizerImplementation | None = OptimizerImplementation.AUTO  # None: library's
    activation_offload: Toggle = Toggle.DISABLED


# Checkpointing modes `activationOffload: auto` tries offload with: torchtune's two setups (offload alone, and
# with every block recomputed). selective and selective-op with offload run when the job pins offload.
AUTO_OFFLOAD_CHECKPOINTING = (Checkpointing.NONE, Checkpointing.FULL)


def offload_tried(pin: Toggle, checkpointing: Checkpointing) -> tuple[bool, ...]:
    """The activation-offload values to try at a checkpointing mode under the job's pin."""
    if pin == Toggle.AUTO and checkpointing not in AUTO_OFFLOAD_CHECKPOINTING:
        return (False,)
    return toggles(pin)


def toggles(pin: Toggle) -> tuple[bool, ...]:
    """The values a toggle leaves to try: off first (the simpler), then on."""
    return {Toggle.AUTO: (False, True), Toggle.ENABLED: (True,), Toggle.DISABLED: (False,)}[pin]


def precisions_allowed(pin: Precision, *, allow_pure_bf16: bool) -> tuple[Precision, ...]:
    """The precisions a pin leaves to try: auto means every mixed and full precision, and bf16-pure only
    when the job allows it (it changes the numerics)."""
    if pin != Precision.AUTO:
        return (pin,)
    return PRECISIONS if allow_pure_bf16 else tuple(p for p in PRECISIONS if p != Precision.BF16_PURE)


@functools.lru_cache(maxsize=64)
def _choices(pins: Pins) -> tuple[tuple[Choice, ...], tuple[str, ...]]:
    engines = _allowed(pins.engine, ENGINES, Engine.AUTO)
    precisions = precisions_allowed(pins.precision, allow_pure_bf16=pins.allow_pure_bf16)
    ckpts = _allowed(pins.checkpointing, CHECKPOINTING, Checkpointing.AUTO)
    offloads = _allowed(pins.offload, OFFLOADS, Offload.AUTO)
    eight_bits = toggles(pins.optimizer8bit)
    techniques = tuple(itertools.product(toggles(pins.optimizer_in_backward), toggles(pins.chunked_loss),
                                         toggles(pins.activation_offload)))
    methods, qlora_compute = pins.methods, pins.qlora_compute
    stage_pin = pins.zero_stage
    choices: list[Choice] = []
    problems: dict[str, None] = {}
    memory_ids: dict[tuple[object, ...], int] = {}
    twin_ids: dict[tuple[object, ...], int] = {}
    ranks: dict[tuple[object, ...], int] = {}  # of the unchunked choices, for their chunked twins
    kept: dict[tuple[object, ...], int] = {}  # of the choices keeping their activations, for their offloading twins
    for method, engine in itertools.product(methods, engines):
        assert isinstance(engine, Engine)
        stages = STAGES[engine] if stage_pin == "auto" else (stage_pin,)
        for stage, offload, eight, precision, ckpt, (in_backward, chunked, act_offload) in itertools.product(
                stages, offloads, eight_bits, precisions, ckpts, techniques):
            assert isinstance(offload, Offload)
            assert isinstance(precision, Precision) and isinstance(ckpt, Checkpointing)
            if act_offload not in offload_tried(pins.activation_offload, ckpt):
                continue
            if method == PeftMethod.QLORA and qlora_compute not in (Precision.AUTO, precision):
                problems[f"QLoRA computes in {qlora_compute.value} (peft.qlora.computeDtype)"] = None
                continue
            regime = "fp32" if precision == Precision.FP32 else "pure" if precision == Precision.BF16_PURE else "mixed"
            memory_key = (method, engine, stage, regime, ckpt, offload, eight, in_backward, chunked, act_offload)
            memory_id = memory_ids.setdefault(memory_key, len(memory_ids))
            twin_id = twin_ids.setdefault((method, engine, stage, precision, ckpt, offload, in_backward, chunked,
                                           act_offload), len(twin_ids))
            candidate = choice(engine, int(stage), precision, ckpt, offload, eight, rank=len(choices),
                               memory_id=memory_id, twin_id=twin_id, peft=method,
                               optimizer_in_backward=in_backward, chunked_loss=chunked,
                               activation_offload=act_offload,
                               optimizer_implementation=implementation_for(
                                   pins.optimizer_implementation, precision=precision, offload=offload,
                                   optimizer8bit=eight))
            problem = strategy_problem(candidate.strategy(optimizer=OptimizerKind.ADAMW))
            if problem is None:
                twin_key = (method, engine, stage, precision, ckpt, offload, eight, in_backward, chunked)
                if act_offload:
                    candidate = replace(candidate, kept_rank=kept.get(twin_key, -1))
                else:
                    kept[twin_key] = len(choices)
                if chunked:
                    unchunked = ranks.get((method, engine, stage, precision, ckpt, offload, eight, in_backward,
                                           act_offload))
                    if unchunked is not None:
                        candidate = replace(candidate, unchunked_rank=unchunked)
                else:
                    ranks[(method, engine, stage, precision, ckpt, offload, eight, in_backward, act_offload)] = \
                        len(choices)
                choices.append(candidate)
            else:
                problems[problem] = None
    if choices:
        return tuple(choices), ()
    return (), tuple([f"the pinned strategy cannot run: {p}" for p in problems] or [
        "the pinned strategy fields leave no configuration to try"
    ])


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))

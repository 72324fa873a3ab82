"""What a job with its own container (`spec.container`) must say so that every plan memfit may choose is
one the script really runs, over the wire-form spec, each violation with its field path (run by
`memfit.api.rules.check_spec`). The CRD's CEL rules (`CEL_RULES`, merged by `memfit.api.crdgen`) say the
same in the same words.

A knob the script does not apply (`spec.container.honors`) is planned at the value `spec.strategy` pins, so
it must be pinned; the global batch stays `training.globalBatchSize` only if the script applies memfit's
gradient accumulation; the engine is the one the script runs (DeepSpeed with memfit's config, else DDP).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.api import pod as contract
from memfit.api.own_code import DEEPSPEED_CARRIES, Knob

Findings = list[tuple[str, str]]

IMAGE_WITH_CONTAINER = "spec.image is memfit's trainer image; a job with spec.container runs spec.container.image"
ACCUMULATION = ("the script must apply memfit's gradient accumulation (list gradientAccumulation, or "
                "deepspeedConfig, in spec.container.honors), or no plan on another world size keeps "
                "training.globalBatchSize")
ENGINE = ("spec.container runs DeepSpeed when it honors deepspeedConfig and DDP otherwise: pin that engine or "
          "leave engine auto")
SHARDING = "sharding and offload need a script that takes memfit's DeepSpeed config (deepspeedConfig in honors)"
PEFT = "LoRA and QLoRA are memfit trainer's: a job with spec.container plans a full fine-tune (peft method none)"
OWNED_ENV = "memfit sets this variable itself (its plan, rendezvous and paths: docs/own-code.md)"
# A knob the script does not apply -> the strategy field that must then pin it, and the CEL test that it is pinned.
PINS: dict[Knob, tuple[str, str]] = {
    Knob.MICRO_BATCH_SIZE: ("microBatchSize", "type(self.strategy.microBatchSize) == int"),
    Knob.PRECISION: ("precision", "self.strategy.precision != 'auto'"),
    Knob.ACTIVATION_CHECKPOINTING: ("activationCheckpointing", "self.strategy.activationCheckpointing != 'auto'"),
    Knob.OPTIMIZER_8BIT: ("optimizer8bit", "self.strategy.optimizer8bit != 'auto'"),
}


def unpinned(knob: Knob) -> str:
    field = PINS[knob][0]
    return (f"spec.container does not honor {knob.value}: pin the {field} the script uses in "
            f"spec.strategy.{field}, or list {knob.value} in spec.container.honors")


def _applies(honors: list[Any], knob: Knob) -> str:
    """CEL: the script applies `knob` (listed, or carried by the DeepSpeed config)."""
    ways = [knob.value] + ([Knob.DEEPSPEED_CONFIG.value] if knob in DEEPSPEED_CARRIES else [])
    return "(" + " || ".join(f"'{w}' in self.container.honors" for w in ways) + ")"


_WITH = "!has(self.container) || "
_HONORS = "has(self.container.honors) && "
_DS = f"({_HONORS}'{Knob.DEEPSPEED_CONFIG.value}' in self.container.honors)"
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "MemoryOptimizedTrainingJob.spec": [
        {"rule": f"{_WITH}!has(self.image) || self.image == ''", "message": IMAGE_WITH_CONTAINER,
         "fieldPath": ".image", "reason": "FieldValueForbidden"},
        {"rule": f"{_WITH}({_HONORS}{_applies([], Knob.GRADIENT_ACCUMULATION)})", "message": ACCUMULATION,
         "fieldPath": ".container.honors", "reason": "FieldValueRequired"},
        *({"rule": f"{_WITH}({_HONORS}{_applies([], knob)}) || {test}", "message": unpinned(knob),
           "fieldPath": f".strategy.{field}", "reason": "FieldValueRequired"} for knob, (field, test) in PINS.items()),
        {"rule": f"{_WITH}self.strategy.engine == 'auto' || self.strategy.engine == ({_DS} ? 'deepspeed' : 'ddp')",
         "message": ENGINE, "fieldPath": ".strategy.engine", "reason": "FieldValueInvalid"},
        {"rule": f"{_WITH}{_DS} || ((type(self.strategy.zeroStage) == string || int(self.strategy.zeroStage) == 0) "
                 "&& self.strategy.offload in ['auto', 'none'])",
         "message": SHARDING, "fieldPath": ".strategy", "reason": "FieldValueForbidden"},
        {"rule": f"{_WITH}!has(self.strategy.peft) || !has(self.strategy.peft.method) || "
                 "self.strategy.peft.method == 'none'", "message": PEFT, "fieldPath": ".strategy.peft.method",
         "reason": "FieldValueForbidden"},
    ],
    "MemoryOptimizedTrainingJob.spec.container.env": [
        {"rule": "self.all(e, !(e.name in [" + ", ".join(f"'{n}'" for n in contract.OWNED_ENV) + "]))",
         "message": OWNED_ENV},
    ],
}


def _strategy(spec: Mapping[str, Any], key: str, default: Any = "auto") -> Any:
    strategy = spec.get("strategy")
    return strategy.get(key, default) if isinstance(strategy, Mapping) else default


def check_own_code(spec: Mapping[str, Any]) -> Findings:
    """Every way a job's own container and its strategy pins disagree, naming the field."""
    container = spec.get("container")
    if not isinstance(container, Mapping):
        return []
    listed = container.get("honors")
    honors: list[Any] = listed if isinstance(listed, list) else []
    deepspeed = Knob.DEEPSPEED_CONFIG.value in honors

    def applies(knob: Knob) -> bool:
        return knob.value in honors or (deepspeed and knob in DEEPSPEED_CARRIES)

    found: Findings = []
    if spec.get("image"):
        found.append(("spec.image", IMAGE_WITH_CONTAINER))
    if not applies(Knob.GRADIENT_ACCUMULATION):
        found.append(("spec.container.honors", ACCUMULATION))
    for knob, (field, _) in PINS.items():
        value = _strategy(spec, field)
        pinned = isinstance(value, int) and not isinstance(value, bool) if field == "microBatchSize" else value != "auto"
        if not applies(knob) and not pinned:
            found.append((f"spec.strategy.{field}", unpinned(knob)))
    engine = _strategy(spec, "engine")
    if engine not in ("auto", "deepspeed" if deepspeed else "ddp"):
        found.append(("spec.strategy.engine", f"{ENGINE}; got {engine}"))
    stage, offload = _strategy(spec, "zeroStage"), _strategy(spec, "offload")
    if not deepspeed and ((isinstance(stage, int) and stage > 0) or offload in ("cpu", "nvme")):
        found.append(("spec.strategy", f"{SHARDING}; got zeroStage {stage}, offload {offload}"))
    peft = _strategy(spec, "peft", {})
    if isinstance(peft, Mapping) and peft.get("method", "none") != "none":
        found.append(("spec.strategy.peft.method", PEFT))
    env = container.get("env")
    for i, item in enumerate(env if isinstance(env, list) else []):
        if isinstance(item, Mapping) and item.get("name") in contract.OWNED_ENV:
            found.append((f"spec.container.env[{i}].name", f"{OWNED_ENV}; got {item.get('name')}"))
    return found

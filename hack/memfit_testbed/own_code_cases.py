"""Jobs with their own container (spec.container) that memfit cannot plan as the script runs, each with the
field the operator names and the start of its message: refused by the operator's rules
(tests/unit/api/test_own_code_rules.py) and by the CRD's CEL rules at admission
(tests/integration/test_own_code_admission.py)."""

from __future__ import annotations

import copy
from typing import Any

from memfit.api.own_code import Knob
from memfit.api.own_code_rules import (
    ACCUMULATION,
    ENGINE,
    IMAGE_WITH_CONTAINER,
    OWNED_ENV,
    PEFT,
    SHARDING,
    unpinned,
)

PROBLEM = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "sequenceLength": 64}}
# The example's plain loop (examples/own-code/train_loop.py): it applies micro-batch, accumulation and
# precision; it never checkpoints activations and runs a 32-bit AdamW, which the strategy pins say.
LOOP: dict[str, Any] = {
    "image": "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime",
    "command": ["torchrun", "/workspace/train_loop.py"],
    "honors": ["microBatchSize", "gradientAccumulation", "precision"],
}
LOOP_PINS = {"activationCheckpointing": "none", "optimizer8bit": "disabled"}


def job_spec(container: dict[str, Any], **strategy: Any) -> dict[str, Any]:
    """The quickstart's problem run by `container`, with the loop's pins and `strategy` over them."""
    return {"problem": copy.deepcopy(PROBLEM), "container": copy.deepcopy(container),
            "strategy": {**LOOP_PINS, **strategy}}


def _honoring(*knobs: str) -> dict[str, Any]:
    return {**LOOP, "honors": list(knobs)}


REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "both images": ({**job_spec(LOOP), "image": "memfit-trainer:1"}, "spec.image", IMAGE_WITH_CONTAINER),
    "no accumulation": (job_spec(_honoring("microBatchSize", "precision")), "spec.container.honors", ACCUMULATION),
    "micro-batch neither honored nor pinned": (job_spec(_honoring("gradientAccumulation", "precision")),
                                               "spec.strategy.microBatchSize", unpinned(Knob.MICRO_BATCH_SIZE)),
    "precision neither honored nor pinned": (job_spec(_honoring("gradientAccumulation", "microBatchSize")),
                                             "spec.strategy.precision", unpinned(Knob.PRECISION)),
    "checkpointing neither honored nor pinned": (
        {**job_spec(LOOP), "strategy": {"optimizer8bit": "disabled"}},
        "spec.strategy.activationCheckpointing", unpinned(Knob.ACTIVATION_CHECKPOINTING)),
    "8-bit optimizer neither honored nor pinned": (
        {**job_spec(LOOP), "strategy": {"activationCheckpointing": "none"}},
        "spec.strategy.optimizer8bit", unpinned(Knob.OPTIMIZER_8BIT)),
    "deepspeed pinned without its config": (job_spec(LOOP, engine="deepspeed"), "spec.strategy.engine", ENGINE),
    "ddp pinned with a deepspeed config": (job_spec(_honoring("deepspeedConfig"), engine="ddp"),
                                           "spec.strategy.engine", ENGINE),
    "sharding without a deepspeed config": (job_spec(LOOP, zeroStage=3), "spec.strategy", SHARDING),
    "offload without a deepspeed config": (job_spec(LOOP, offload="cpu"), "spec.strategy", SHARDING),
    "lora": (job_spec(LOOP, peft={"method": "lora"}), "spec.strategy.peft.method", PEFT),
    "memfit's variable": (job_spec({**LOOP, "env": [{"name": "MEMFIT_MICRO_BATCH_SIZE", "value": "4"}]}),
                          "spec.container.env[0].name", OWNED_ENV),
}

"""Cross-field rules of the MOTJ spec, over the wire (camelCase) dict; mirrored by the CRD's CEL rules.

Written against raw dicts so that `memfit validate` reports them even when other fields are invalid.
Each rule returns (field path, message) or None; a rule ignores values of the wrong type (the field
validation reports those).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memfit.api.finetune_rules import check_finetune
from memfit.api.own_code_rules import check_own_code
from memfit.api.peft_rules import check_peft
from memfit.api.pod_template_rules import check_pod_template
from memfit.api.technique_rules import check_techniques

Finding = tuple[str, str] | None


def _get(doc: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def problem_exactly_one(spec: Any) -> Finding:
    problem = _get(spec, "problem")
    if not isinstance(problem, dict):
        return None
    given = [k for k in ("builtin", "huggingface", "entrypoint") if problem.get(k) is not None]
    if len(given) != 1:
        return "spec.problem", (
            f"exactly one of builtin, huggingface or entrypoint must be set; got {', '.join(given) or 'none'}"
        )
    return None


def heads_divide_hidden(spec: Any) -> Finding:
    hidden, heads = (
        _int(_get(spec, "problem", "builtin", "hidden")),
        _int(_get(spec, "problem", "builtin", "heads")),
    )
    if hidden and heads and hidden > 0 and heads > 0 and hidden % heads:
        return "spec.problem.builtin.heads", f"hidden ({hidden}) must be divisible by heads ({heads})"
    return None


def patch_divides_image(spec: Any) -> Finding:
    builtin = _get(spec, "problem", "builtin")
    if _get(builtin, "kind") != "vit":
        return None
    image, patch = _int(_get(builtin, "imageSize")), _int(_get(builtin, "patchSize"))
    if image and patch and patch > 0 and image % patch:
        return (
            "spec.problem.builtin.patchSize",
            f"imageSize ({image}) must be divisible by patchSize ({patch})",
        )
    return None


def micro_batch_divides_global(spec: Any) -> Finding:
    mbs, gbs = _int(_get(spec, "strategy", "microBatchSize")), _int(_get(spec, "training", "globalBatchSize"))
    gbs = 8 if gbs is None and _get(spec, "training", "globalBatchSize") is None else gbs
    if mbs and gbs and mbs > 0 and gbs > 0 and gbs % mbs:
        return "spec.strategy.microBatchSize", (
            f"microBatchSize ({mbs}) must divide training.globalBatchSize ({gbs})"
        )
    return None


def nvme_needs_deepspeed(spec: Any) -> Finding:
    engine = _get(spec, "strategy", "engine")
    if _get(spec, "strategy", "offload") == "nvme" and engine not in (None, "auto", "deepspeed"):
        return "spec.strategy.offload", f"offload nvme needs engine deepspeed or auto; got engine {engine}"
    return None


def ddp_does_not_shard(spec: Any) -> Finding:
    stage = _int(_get(spec, "strategy", "zeroStage"))
    if _get(spec, "strategy", "engine") == "ddp" and stage is not None and stage > 0:
        return "spec.strategy.zeroStage", (
            f"engine ddp does not shard: zeroStage must be auto or 0, got {stage} (use fsdp or deepspeed)"
        )
    return None


def ddp_does_not_offload(spec: Any) -> Finding:
    offload = _get(spec, "strategy", "offload")
    if _get(spec, "strategy", "engine") == "ddp" and offload in ("cpu", "nvme"):
        return (
            "spec.strategy.offload",
            f"engine ddp cannot offload: offload must be auto or none, got {offload}",
        )
    return None


SPEC_RULES: tuple[Callable[[Any], Finding], ...] = (
    problem_exactly_one,
    heads_divide_hidden,
    patch_divides_image,
    micro_batch_divides_global,
    nvme_needs_deepspeed,
    ddp_does_not_shard,
    ddp_does_not_offload,
)


def check_spec(spec: Any) -> list[tuple[str, str]]:
    """Every cross-field violation of a MOTJ spec (wire form): `strategy.peft` and the fine-tune rules
    (model source, data, output) `podTemplate`'s and `container`'s included."""
    found = [finding for rule in SPEC_RULES if (finding := rule(spec)) is not None]
    if not isinstance(spec, dict):
        return found
    return found + check_peft(spec) + check_finetune(spec) + check_pod_template(spec) + check_own_code(spec) + \
        check_techniques(spec)

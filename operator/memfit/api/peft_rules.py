"""Cross-field rules of `strategy.peft` over the wire-form spec: each violation with its field path and
what is allowed (run by `memfit.api.rules.check_spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.api.peft_layers import DEFAULT_TARGETS, architecture, module_names, target_linears


def check_peft(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every violation of `strategy.peft` (wire form), with its field path and what is allowed."""
    strategy = spec.get("strategy")
    if not isinstance(strategy, Mapping) or not isinstance(peft := strategy.get("peft"), Mapping):
        return []
    base = "spec.strategy.peft"
    found: list[tuple[str, str]] = []
    method, allowed = peft.get("method", "none"), peft.get("allowed") or []
    allowed = [m for m in allowed if isinstance(m, str)] if isinstance(allowed, list) else []
    if method == "auto" and not allowed:
        found.append((f"{base}.allowed", "method auto needs a non-empty allowed list: any of none, lora, qlora"))
    if method != "auto" and allowed:
        found.append((f"{base}.allowed", f"allowed applies only to method auto (method is {method}); "
                      "remove it or set method: auto"))
    if "auto" in allowed:
        found.append((f"{base}.allowed", "allowed lists concrete methods: none, lora or qlora (not auto)"))
    uses = set(allowed) if method == "auto" else {method}
    if uses & {"lora", "qlora"}:
        found += _check_lora(spec.get("problem"), peft.get("lora"), base)
    if "qlora" in uses:
        found += _check_qlora(strategy, peft.get("qlora"), base, only=uses == {"qlora"})
    return found


def _check_lora(problem: Any, lora: Any, base: str) -> list[tuple[str, str]]:
    lora = lora if isinstance(lora, Mapping) else {}
    found: list[tuple[str, str]] = []
    arch = architecture(problem)
    targets = lora.get("targetModules") or []
    if arch is not None:
        known = module_names(arch)
        for index, name in enumerate(targets):
            if name not in known:
                found.append((f"{base}.lora.targetModules[{index}]",
                              f"{name!r} is not a linear layer of a {arch} block; allowed: {', '.join(known)}"))
    elif not targets and isinstance(problem, Mapping) and (problem.get("entrypoint") or problem.get("huggingface")):
        found.append((f"{base}.lora.targetModules", "no default targets for this model: name the linear "
                      "modules (attribute names, e.g. q_proj, v_proj)"))
    rank = lora.get("rank", 16)
    linears = target_linears(problem, [t for t in (targets or DEFAULT_TARGETS.get(arch or "", ()))])
    if linears and isinstance(rank, int):
        smallest = min(min(i, o) for i, o in linears)
        if rank > smallest:
            found.append((f"{base}.lora.rank", f"rank {rank} is larger than the smallest targeted layer "
                          f"dimension ({smallest}); use a rank of at most {smallest}"))
    return found


def _check_qlora(strategy: Mapping[str, Any], qlora: Any, base: str, *, only: bool) -> list[tuple[str, str]]:
    qlora = qlora if isinstance(qlora, Mapping) else {}
    found: list[tuple[str, str]] = []
    engine, stage, offload = strategy.get("engine", "auto"), strategy.get("zeroStage", "auto"), strategy.get("offload")
    if only and engine == "deepspeed" and isinstance(stage, int) and stage < 3:
        found.append((f"{base}.method", f"QLoRA's 4-bit base cannot be held by DeepSpeed ZeRO-{stage} "
                      "(it casts the model to its dtype); allowed engines: ddp, fsdp, or deepspeed with zeroStage 3"))
    if only and offload in ("cpu", "nvme"):
        found.append((f"{base}.method", f"QLoRA's 4-bit base cannot be offloaded (offload {offload}); "
                      "set offload to none or auto"))
    compute, precision = qlora.get("computeDtype", "auto"), strategy.get("precision", "auto")
    if compute != "auto" and precision not in (None, "auto") and compute != precision and only:
        found.append((f"{base}.qlora.computeDtype", f"computeDtype {compute} conflicts with strategy.precision "
                      f"{precision}; the 4-bit weights are dequantised to the training precision"))
    return found


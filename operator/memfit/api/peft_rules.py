"""Cross-field rules of `strategy.peft` over the wire-form spec: each violation with its field path and
what is allowed (run by `memfit.api.rules.check_spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.api.common import Engine, Offload, PeftMethod
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
    found += _check_engine(strategy, {u for u in uses if isinstance(u, str)}, base)
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


def _check_engine(strategy: Mapping[str, Any], uses: set[str], base: str) -> list[tuple[str, str]]:
    """Pinned engine, ZeRO stage and offload that no allowed PEFT method can run on (when the full
    fine-tune is not allowed too: then the planner simply does not offer that method there)."""
    if "none" in uses or not uses <= {"lora", "qlora"}:
        return []
    engine, stage, offload = strategy.get("engine", "auto"), strategy.get("zeroStage", "auto"), strategy.get("offload")
    engines = [Engine(engine)] if engine in ("ddp", "fsdp", "deepspeed") else [Engine.DDP, Engine.FSDP, Engine.DEEPSPEED]
    offloads = [Offload(offload)] if offload in ("none", "cpu", "nvme") else [Offload.NONE, Offload.CPU, Offload.NVME]
    excluded: dict[str, str] = {}
    for method in sorted(uses):
        reasons = []
        for e in engines:
            stages = [stage] if isinstance(stage, int) else {Engine.DDP: [0], Engine.FSDP: [2, 3],
                                                             Engine.DEEPSPEED: [0, 1, 2, 3]}[e]
            reasons += [peft_engine_problem(PeftMethod(method), engine=e, zero_stage=z, offload=o)
                        for z in stages for o in offloads]
        if reasons and all(r is not None for r in reasons):
            excluded[method] = next(r for r in reasons if r is not None)
    if set(excluded) != uses:  # some allowed method can run: the planner offers only that one
        return []
    field = f"spec.strategy.{_culprit(strategy)}"
    return [(field, f"{reason}; with {base}.method {method}, allowed: {ALLOWED_ENGINES[method]}")
            for method, reason in excluded.items()]


ALLOWED_ENGINES = {
    "lora": "ddp, fsdp (zeroStage 2 or 3) or deepspeed with zeroStage 3; offload cpu only with deepspeed "
            "zeroStage 3",
    "qlora": "ddp or fsdp (zeroStage 2 or 3), without offload",
}


def _culprit(strategy: Mapping[str, Any]) -> str:
    """The pinned field that excludes the method: offload if pinned away from none, else zeroStage if
    pinned, else engine."""
    if strategy.get("offload") in ("cpu", "nvme"):
        return "offload"
    if isinstance(strategy.get("zeroStage"), int) and strategy.get("engine") == "deepspeed":
        return "zeroStage"
    return "engine"


def _check_qlora(strategy: Mapping[str, Any], qlora: Any, base: str, *, only: bool) -> list[tuple[str, str]]:
    qlora = qlora if isinstance(qlora, Mapping) else {}
    found: list[tuple[str, str]] = []
    compute, precision = qlora.get("computeDtype", "auto"), strategy.get("precision", "auto")
    if compute != "auto" and precision not in (None, "auto") and compute != precision and only:
        found.append((f"{base}.qlora.computeDtype", f"computeDtype {compute} conflicts with strategy.precision "
                      f"{precision}; the 4-bit weights are dequantised to the training precision"))
    return found


def peft_engine_problem(method: PeftMethod, *, engine: Engine, zero_stage: int, offload: Offload) -> str | None:
    """Why a LoRA/QLoRA method cannot run on this engine, stage and offload (None when it can): the one
    rule the planner's space, the API's cross-field checks and the trainer's plan check share."""
    if method == PeftMethod.AUTO:
        return "peft must be concrete (none, lora or qlora), not auto"
    if method == PeftMethod.LORA:
        if engine == Engine.DEEPSPEED and zero_stage != 3:
            # memfit runs adapters on ZeRO-3, which partitions the frozen base; ZeRO-1/2 would keep a
            # replicated base that DDP keeps more cheaply.
            return f"LoRA on DeepSpeed runs with ZeRO stage 3 (the frozen base partitioned), not stage {zero_stage}"
        if offload == Offload.NVME:
            return "LoRA offloads to the CPU only (ZeRO-Offload of the adapters' optimizer), not to NVMe"
        if offload == Offload.CPU and engine != Engine.DEEPSPEED:
            return "LoRA offloads with DeepSpeed ZeRO-3 only (FSDP's CPU offload of adapters is not modelled)"
    if method == PeftMethod.QLORA:
        if engine == Engine.DEEPSPEED:
            # DeepSpeed casts the module to its dtype and partitions Params4bit as ordinary tensors.
            return "QLoRA does not run on DeepSpeed (it casts and partitions the 4-bit base as plain tensors)"
        if offload != Offload.NONE:
            return "QLoRA's 4-bit base cannot be offloaded"
    return None

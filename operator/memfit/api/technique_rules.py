"""Cross-field rules of the memory techniques over the wire-form spec (run by
`memfit.api.rules.check_spec`): a pinned combination that cannot run is refused naming both fields and
what is allowed. The same limits, on concrete configurations, are `memfit.memory.technique_rules`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit.api.problem import TASKS_OF

_BASE = "spec.strategy"


def _peft_methods(strategy: Mapping[str, Any]) -> set[str]:
    peft = strategy.get("peft")
    if not isinstance(peft, Mapping):
        return {"none"}
    method = peft.get("method", "none")
    allowed = peft.get("allowed") or []
    return {m for m in allowed if isinstance(m, str)} if method == "auto" else {method}


def _pure_bf16(strategy: Mapping[str, Any]) -> list[tuple[str, str]]:
    if strategy.get("precision") != "bf16-pure":
        return []
    found: list[tuple[str, str]] = []
    engine, offload = strategy.get("engine", "auto"), strategy.get("offload", "auto")
    if engine == "deepspeed":
        found.append((f"{_BASE}.precision", "precision bf16-pure runs on engine ddp, fsdp or auto; engine is "
                      "deepspeed (it keeps an fp32 master copy: use precision bf16)"))
    if offload in ("cpu", "nvme"):
        found.append((f"{_BASE}.precision", f"precision bf16-pure runs with offload none or auto; offload is {offload}"))
    if "none" not in _peft_methods(strategy):
        found.append((f"{_BASE}.precision", "precision bf16-pure trains a full fine-tune: peft must allow none"))
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _optimizer_in_backward(spec: Mapping[str, Any], strategy: Mapping[str, Any]) -> list[tuple[str, str]]:
    if strategy.get("optimizerInBackward") != "enabled":
        return []
    field = f"{_BASE}.optimizerInBackward"
    found: list[tuple[str, str]] = []
    engine = strategy.get("engine", "auto")
    if engine in ("fsdp", "deepspeed"):
        found.append((field, f"optimizerInBackward enabled runs on engine ddp or auto (one GPU); engine is {engine}"))
    if strategy.get("precision") == "fp16":
        found.append((field, "optimizerInBackward enabled cannot unscale fp16 gradients: precision must be auto, "
                      "bf16, bf16-pure or fp32"))
    micro = strategy.get("microBatchSize")
    training = _mapping(spec.get("training"))
    batch = training.get("globalBatchSize", 8)
    if isinstance(micro, int) and isinstance(batch, int) and micro != batch:
        found.append((field, f"optimizerInBackward enabled cannot accumulate gradients on its one GPU: "
                      f"microBatchSize ({micro}) must equal training.globalBatchSize ({batch}) or be auto"))
    if "none" not in _peft_methods(strategy):
        found.append((field, "optimizerInBackward enabled trains a full fine-tune: peft must allow none"))
    if spec.get("container") is not None:
        found.append((field, "optimizerInBackward enabled is applied by memfit's trainer; a job's own container "
                      "steps its own optimizer: set it to auto or disabled"))
    return found


def _chunked_loss(spec: Mapping[str, Any], strategy: Mapping[str, Any]) -> list[tuple[str, str]]:
    if strategy.get("chunkedLoss") != "enabled":
        return []
    problem = _mapping(spec.get("problem"))
    builtin = problem.get("builtin")
    why = None
    if spec.get("container") is not None or problem.get("entrypoint") is not None:
        why = "a job's own code or entrypoint computes its own loss"
    elif isinstance(builtin, Mapping) and builtin.get("kind") == "vit":
        why = "the builtin vit classifies images (no language-model head)"
    hf = _mapping(problem.get("huggingface"))
    task = hf.get("task", "auto")
    if why is None and task not in ("auto", "causal-lm"):
        why = f"spec.problem.huggingface.task is {task}"
    if why is None:
        return []
    return [(f"{_BASE}.chunkedLoss", f"chunkedLoss enabled needs a language-model head memfit builds (builtin "
             f"gpt or bert, a Hugging Face causal LM); {why}: set it to auto or disabled")]


def _activation_offload(spec: Mapping[str, Any], strategy: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Activation offload hooks memfit's trainer's blocks and is modelled for full fine-tunes."""
    if strategy.get("activationOffload") != "enabled":
        return []
    field = f"{_BASE}.activationOffload"
    found: list[tuple[str, str]] = []
    if "none" not in _peft_methods(strategy):
        found.append((field, "activationOffload enabled trains a full fine-tune: peft must allow none"))
    if spec.get("container") is not None or _mapping(spec.get("problem")).get("entrypoint") is not None:
        found.append((field, "activationOffload enabled hooks the blocks of a model memfit's trainer builds; a job's "
                             "own code or entrypoint keeps its activations as it does: set it to auto or disabled"))
    return found


def _optimizer_implementation(spec: Mapping[str, Any], strategy: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A pinned implementation for an optimizer that runs its own kernels, or a script's own optimizer."""
    chosen = strategy.get("optimizerImplementation", "auto")
    if chosen == "auto":
        return []
    field = f"{_BASE}.optimizerImplementation"
    found: list[tuple[str, str]] = []
    if strategy.get("optimizer8bit") == "enabled":
        found.append((field, f"optimizerImplementation {chosen} picks torch's 32-bit step; optimizer8bit is enabled "
                             "(bitsandbytes' own kernels): set one of them to auto"))
    if strategy.get("precision") == "bf16-pure":
        found.append((field, f"optimizerImplementation {chosen} picks torch's 32-bit step; precision is bf16-pure "
                             "(memfit's stochastically rounded step): set optimizerImplementation to auto"))
    offload = strategy.get("offload", "auto")
    if offload in ("cpu", "nvme"):
        found.append((field, f"optimizerImplementation {chosen} picks the GPU's step; offload is {offload} (the "
                             "optimizer steps on the host with its own kernels): set one of them to auto or none"))
    if spec.get("container") is not None:
        found.append((field, f"optimizerImplementation {chosen} is applied by memfit's trainer; a job's own "
                             "container builds its own optimizer: set it to auto"))
    return found


def _selective_op(spec: Mapping[str, Any], strategy: Mapping[str, Any]) -> list[tuple[str, str]]:
    """selective-op is memfit_trainer's per-op policy over full fine-tunes."""
    if strategy.get("activationCheckpointing") != "selective-op":
        return []
    field = f"{_BASE}.activationCheckpointing"
    found: list[tuple[str, str]] = []
    if "none" not in _peft_methods(strategy):
        found.append((field, "activationCheckpointing selective-op trains a full fine-tune: peft must allow none "
                             "(LoRA/QLoRA use selective or full)"))
    if spec.get("container") is not None:
        found.append((field, "activationCheckpointing selective-op is memfit's trainer's per-op policy; a job's own "
                             "container checkpoints as it does: use none, selective, full or auto"))
    return found


def _hf_task(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A task the inline config's architecture has no head for; sequence classification on real data (memfit's
    loader packs text, it has no labels)."""
    hf = _mapping(_mapping(spec.get("problem")).get("huggingface"))
    task = hf.get("task")
    if task in (None, "auto"):
        return []
    field = "spec.problem.huggingface.task"
    found: list[tuple[str, str]] = []
    model_type = _mapping(hf.get("config")).get("model_type")
    allowed = TASKS_OF.get(model_type) if isinstance(model_type, str) else None
    if allowed is not None and task not in allowed:
        found.append((field, f"{model_type} has no {task} head in transformers (allowed: auto, "
                             f"{', '.join(t.value for t in allowed)})"))
    data = _mapping(spec.get("data"))
    if task == "sequence-classification" and (data.get("huggingface") is not None or data.get("files") is not None):
        found.append((field, "sequence-classification trains on synthetic labels only: spec.data is packed text "
                             "without labels; train labelled data with your own code (spec.problem.entrypoint or "
                             "spec.container)"))
    return found


def check_techniques(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every violation of the techniques' pins (wire form), with its field path and what is allowed."""
    strategy = spec.get("strategy")
    if not isinstance(strategy, Mapping):
        return _hf_task(spec)
    return (_pure_bf16(strategy) + _optimizer_in_backward(spec, strategy) + _chunked_loss(spec, strategy)
            + _activation_offload(spec, strategy) + _optimizer_implementation(spec, strategy)
            + _selective_op(spec, strategy) + _hf_task(spec))

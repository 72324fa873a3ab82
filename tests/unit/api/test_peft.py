"""strategy.peft: what the user may allow, and every bad input rejected with its field path."""

from __future__ import annotations

from typing import Any

import pytest
from memfit.api.common import PeftMethod
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.peft import PeftSpec, adapter_settings
from memfit.api.peft_layers import DEFAULT_TARGETS, target_linears
from memfit.api.rules import check_spec

GPT = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}}
LLAMA = {"huggingface": {"model": "org/llama", "config": {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}}}


def spec(peft: dict[str, Any], *, problem: dict[str, Any] | None = None, **strategy: Any) -> dict[str, Any]:
    return {"problem": problem or GPT, "strategy": {"peft": peft, **strategy}}


BAD = {
    "auto without allowed": (spec({"method": "auto"}), "spec.strategy.peft.allowed", "non-empty allowed list"),
    "allowed without auto": (spec({"method": "lora", "allowed": ["qlora"]}), "spec.strategy.peft.allowed",
                             "only to method auto"),
    "auto in allowed": (spec({"method": "auto", "allowed": ["auto"]}), "spec.strategy.peft.allowed",
                        "concrete methods"),
    "unknown target": (spec({"method": "lora", "lora": {"targetModules": ["qkv", "q_proj"]}}),
                       "spec.strategy.peft.lora.targetModules[1]", "allowed: qkv, proj, fc, out"),
    "llama target of another model": (spec({"method": "qlora", "lora": {"targetModules": ["c_attn"]}},
                                           problem=LLAMA), "spec.strategy.peft.lora.targetModules[0]",
                                      "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"),
    "rank larger than the layer": (spec({"method": "lora", "lora": {"rank": 100}}), "spec.strategy.peft.lora.rank",
                                   "at most 64"),
    "rank larger than llama's k_proj": (spec({"method": "lora", "lora": {"rank": 2048}}, problem=LLAMA),
                                        "spec.strategy.peft.lora.rank", "at most 1024"),
    "qlora on zero-1": (spec({"method": "qlora"}, engine="deepspeed", zeroStage=1), "spec.strategy.zeroStage",
                        "QLoRA does not run on DeepSpeed"),
    "qlora on zero-3": (spec({"method": "qlora"}, engine="deepspeed", zeroStage=3), "spec.strategy.zeroStage",
                        "allowed: ddp or fsdp (zeroStage 2 or 3), without offload"),
    "qlora on deepspeed": (spec({"method": "qlora"}, engine="deepspeed"), "spec.strategy.engine",
                           "QLoRA does not run on DeepSpeed"),
    "qlora offloaded": (spec({"method": "qlora"}, engine="fsdp", offload="cpu"), "spec.strategy.offload",
                        "cannot be offloaded"),
    "lora on zero-2": (spec({"method": "lora"}, engine="deepspeed", zeroStage=2), "spec.strategy.zeroStage",
                       "LoRA on DeepSpeed runs with ZeRO stage 3"),
    "lora offloaded on fsdp": (spec({"method": "lora"}, engine="fsdp", offload="cpu"), "spec.strategy.offload",
                               "offload cpu only with deepspeed zeroStage 3"),
    "lora offloaded to nvme": (spec({"method": "lora"}, offload="nvme"), "spec.strategy.offload",
                               "not to NVMe"),
    "auto where neither method runs": (spec({"method": "auto", "allowed": ["lora", "qlora"]}, engine="deepspeed",
                                            zeroStage=1), "spec.strategy.zeroStage", "with spec.strategy.peft.method qlora"),
    "qlora compute vs precision": (spec({"method": "qlora", "qlora": {"computeDtype": "fp16"}}, precision="bf16"),
                                   "spec.strategy.peft.qlora.computeDtype", "conflicts with strategy.precision"),
    "entrypoint without targets": (spec({"method": "lora"}, problem={"entrypoint": "pkg.mod:fn"}),
                                   "spec.strategy.peft.lora.targetModules", "name the linear modules"),
}


@pytest.mark.parametrize(("doc", "path", "words"), list(BAD.values()), ids=list(BAD))
def test_bad_peft_input_is_rejected_with_its_field_path(doc: dict[str, Any], path: str, words: str) -> None:
    findings = dict(check_spec(doc))
    assert path in findings, findings
    assert words in findings[path]
    with pytest.raises(ValueError, match=path.replace("[", r"\[").replace("]", r"\]")):
        MemoryOptimizedTrainingJobSpec.model_validate(doc)


def test_defaults_keep_the_full_fine_tune() -> None:
    job = MemoryOptimizedTrainingJobSpec.model_validate({"problem": GPT})
    assert job.strategy.peft.method == PeftMethod.NONE
    assert job.strategy.peft.methods() == (PeftMethod.NONE,)


def test_auto_allows_exactly_the_listed_methods_in_preference_order() -> None:
    peft = PeftSpec.model_validate({"method": "auto", "allowed": ["qlora", "none"]})
    assert peft.methods() == (PeftMethod.NONE, PeftMethod.QLORA)


def test_default_targets_are_every_linear_layer_of_a_llama_block() -> None:
    settings = adapter_settings(LLAMA, PeftSpec.model_validate({"method": "lora"}))
    assert settings is not None
    assert settings.target_modules == list(DEFAULT_TARGETS["llama"])
    linears = target_linears(LLAMA, settings.target_modules)
    # Llama-3-8B, r = 16 on all seven projections: peft reports 41,943,040 trainable parameters.
    assert linears is not None and 32 * sum(16 * (i + o) for i, o in linears) == 41_943_040


ACCEPTED = {
    "lora on zero-3 with cpu offload": spec({"method": "lora"}, engine="deepspeed", zeroStage=3, offload="cpu"),
    "qlora on fsdp": spec({"method": "qlora"}, engine="fsdp", zeroStage=3),
    "auto lora or qlora on deepspeed (lora can run)": spec({"method": "auto", "allowed": ["lora", "qlora"]},
                                                           engine="deepspeed"),
    "auto with the full fine-tune on zero-1": spec({"method": "auto", "allowed": ["none", "qlora"]},
                                                   engine="deepspeed", zeroStage=1),
}


@pytest.mark.parametrize("doc", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_peft_on_the_engines_that_hold_it_is_accepted(doc: dict[str, Any]) -> None:
    assert check_spec(doc) == []
    MemoryOptimizedTrainingJobSpec.model_validate(doc)

"""Analytic shapes: parameter counts equal what transformers and memfit_trainer build."""

from __future__ import annotations

from typing import Any

import pytest
from memfit.api.problem import BuiltinProblem, HuggingFaceProblem, Problem
from memfit.memory import ShapeError, shape_from_hf_config, shape_from_problem
from memory_factories import BERT_LARGE, GPT2, LLAMA2_7B, LLAMA32_1B, MISTRAL_7B, QWEN25_05B, VIT_L16

# Counted with transformers 5.24 on the meta device (AutoModelForCausalLM / ForMaskedLM /
# ViTForImageClassification from these configs): the published model sizes.
HF_PARAMETERS = {
    "gpt2 124M": (GPT2, 124_439_808),
    "llama-2-7b": (LLAMA2_7B, 6_738_415_616),
    "llama-3.2-1b tied, GQA": (LLAMA32_1B, 1_235_814_400),
    "qwen2.5-0.5b qkv bias, tied": (QWEN25_05B, 494_032_768),
    "mistral-7b GQA": (MISTRAL_7B, 7_241_732_096),
    "bert-large MLM head": (BERT_LARGE, 335_174_458),
    "vit-l/16 classifier": (VIT_L16, 304_326_632),
}


@pytest.mark.parametrize(("config", "parameters"), HF_PARAMETERS.values(), ids=HF_PARAMETERS.keys())
def test_hf_parameter_counts_match_transformers(config: dict[str, Any], parameters: int) -> None:
    assert shape_from_hf_config(config, sequence_length=512).parameters == parameters


def test_llama_shape_has_gqa_gated_mlp_and_the_embedding_as_largest_layer() -> None:
    shape = shape_from_hf_config(LLAMA32_1B, sequence_length=4096)
    assert (shape.kv_heads, shape.gated_mlp, shape.separate_qkv) == (8, True, True)
    assert shape.largest_layer_parameters == 128256 * 2048
    assert shape.tokens_per_sample == 4096


def test_vit_tokens_are_patches_plus_class_token() -> None:
    assert shape_from_hf_config(VIT_L16, sequence_length=1).tokens_per_sample == 14 * 14 + 1


# Counted by building memfit_trainer.problems.builtin models with torch.
BUILTIN_PARAMETERS = {
    "gpt 2x64": ({"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "sequenceLength": 64}, 169_728),
    "bert 3x96 ffn 200": (
        {"kind": "bert", "layers": 3, "hidden": 96, "heads": 4, "vocab": 1000, "sequenceLength": 128,
         "ffnHidden": 200}, 433_464),
    "vit 2x64 32px": (
        {"kind": "vit", "layers": 2, "hidden": 64, "heads": 4, "imageSize": 32, "patchSize": 8, "numClasses": 10},
        114_250),
}


@pytest.mark.parametrize(("spec", "parameters"), BUILTIN_PARAMETERS.values(), ids=BUILTIN_PARAMETERS.keys())
def test_builtin_parameter_counts_match_the_trainer(spec: dict[str, Any], parameters: int) -> None:
    problem = Problem(builtin=BuiltinProblem.model_validate(spec))
    assert shape_from_problem(problem).parameters == parameters


BAD = {
    "unsupported model type": ({"model_type": "mamba"}, "model_type: 'mamba' is not modelled"),
    "missing hidden size": ({"model_type": "llama"}, "config.hidden_size: missing"),
    "heads not dividing hidden": (
        {**LLAMA2_7B, "num_attention_heads": 30}, "num_attention_heads: 30 does not divide hidden size 4096"),
    "kv heads not dividing heads": ({**MISTRAL_7B, "num_key_value_heads": 5}, "num_key_value_heads: 5"),
    "negative layers": ({**LLAMA2_7B, "num_hidden_layers": -2}, "num_hidden_layers: must be a positive integer"),
    "sequence longer than gpt2 positions": ({**GPT2, "n_positions": 256}, "exceeds n_positions 256"),
}


@pytest.mark.parametrize(("config", "message"), BAD.values(), ids=BAD.keys())
def test_bad_hf_configs_name_the_field(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        shape_from_hf_config(config, sequence_length=512)


def test_entrypoint_needs_a_profile() -> None:
    with pytest.raises(ShapeError, match="known only from a profile"):
        shape_from_problem(Problem(entrypoint="pkg.mod:problem"))


def test_hf_problem_without_inline_config_is_not_downloaded() -> None:
    with pytest.raises(ShapeError, match="memfit does not download"):
        shape_from_problem(Problem(huggingface=HuggingFaceProblem(model="meta-llama/Llama-3.2-1B")))


def test_builtin_heads_must_divide_hidden() -> None:
    # The API leaves cross-field checks to `memfit validate` / CEL; the shape checks again.
    spec = BuiltinProblem(kind="gpt", layers=2, hidden=65, heads=4)
    with pytest.raises(ShapeError, match=r"problem\.builtin\.heads: 4 does not divide hidden 65"):
        shape_from_problem(spec)

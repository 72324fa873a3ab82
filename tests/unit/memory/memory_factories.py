"""Fluent factories for memory-model tests: public model configs and strategies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memfit.api.common import Checkpointing, Engine, Offload, OptimizerImplementation, Precision
from memfit.api.job import OptimizerKind
from memfit.api.profile import ModelShape
from memfit.memory import Shape, Strategy, shape_from_hf_config
from memfit.memory.strategy import Device

GIB = 1024**3

# config.json values of public models (only the fields the shape needs).
GPT2 = {"model_type": "gpt2"}
LLAMA2_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False,
}
LLAMA32_1B = {
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "tie_word_embeddings": True,
}
QWEN25_05B = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
}
MISTRAL_7B = {
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "tie_word_embeddings": False,
}
BERT_LARGE = {
    "model_type": "bert", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
    "num_attention_heads": 16, "vocab_size": 30522,
}
VIT_L16 = {
    "model_type": "vit", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
    "num_attention_heads": 16, "image_size": 224, "patch_size": 16, "num_labels": 1000,
}


def hf_shape(config: dict[str, Any], seq: int = 2048) -> Shape:
    return Shape.of(shape_from_hf_config(config, sequence_length=seq))


def model_shape(**overrides: Any) -> ModelShape:
    """A GPT-like ModelShape; override any field."""
    values: dict[str, Any] = {
        "family": "decoder", "parameters": 1_000_000_000, "largest_layer_parameters": 100_000_000,
        "layers": 24, "hidden": 2048, "heads": 16, "ffn_hidden": 8192, "vocab": 32000,
        "tokens_per_sample": 2048,
    }
    values.update(overrides)
    return ModelShape(**values)


class S:
    """Fluent strategy builder: `S().deepspeed(2).bf16().world(8).ckpt("full").mbs(4).build()`."""

    def __init__(self) -> None:
        self.s = Strategy()

    def _set(self, **kw: Any) -> S:
        self.s = replace(self.s, **kw)
        return self

    def _config(self, **kw: Any) -> S:
        self.s = self.s.with_config(**kw)
        return self

    def ddp(self) -> S:
        return self._config(engine=Engine.DDP, zero_stage=0)

    def fsdp(self, stage: int = 3) -> S:
        return self._config(engine=Engine.FSDP, zero_stage=stage)

    def deepspeed(self, stage: int) -> S:
        return self._config(engine=Engine.DEEPSPEED, zero_stage=stage)

    def bf16(self) -> S:
        return self._config(precision=Precision.BF16)

    def fp32(self) -> S:
        return self._config(precision=Precision.FP32)

    def ckpt(self, mode: str) -> S:
        return self._config(activation_checkpointing=Checkpointing(mode))

    def offload(self, where: str) -> S:
        return self._config(offload=Offload(where))

    def eight_bit(self) -> S:
        return self._config(optimizer8bit=True)

    def pure(self) -> S:
        return self._config(precision=Precision.BF16_PURE)

    def in_backward(self) -> S:
        return self._config(optimizer_in_backward=True)

    def chunked(self) -> S:
        return self._config(chunked_loss=True)

    def act_offload(self) -> S:
        return self._config(activation_offload=True)

    def implementation(self, name: str) -> S:
        return self._config(optimizer_implementation=OptimizerImplementation(name))

    def sgd(self) -> S:
        return self._set(optimizer=OptimizerKind.SGD)

    def device(self, name: str) -> S:
        return self._set(device=Device(name))

    def world(self, n: int, per_node: int | None = None) -> S:
        return self._set(world_size=n, gpus_per_node=per_node or min(n, 8))

    def mbs(self, b: int, accumulation: int = 1) -> S:
        return self._config(micro_batch_size=b, gradient_accumulation_steps=accumulation)

    def build(self) -> Strategy:
        return self.s

"""The model shape in the form the hot path uses: a frozen dataclass with the derived counts."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.profile import ModelShape

# bitsandbytes keeps 32-bit optimizer state for tensors smaller than `min_8bit_size=4096` elements
# (bitsandbytes/optim/optimizer.py): norms and biases of models with hidden < 4096.
BNB_MIN_8BIT_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Shape:
    """Counts the memory and time models need, derived once from a ModelShape."""

    family: str
    parameters: int
    trainable: int
    small_trainable: int  # trainable parameters in tensors too small for 8-bit state
    largest_layer: int  # L_max: the largest single module (DeepSpeed's ZeRO-3 estimator term)
    block_parameters: int  # one transformer block: the FSDP / ZeRO-3 gather unit
    root_parameters: int  # outside the blocks: embeddings, final norm, head
    buffer_bytes: int
    layers: int
    hidden: int
    heads: int
    kv_hidden: int  # hidden size of K and V (hidden x kv_heads / heads)
    ffn: int
    vocab: int
    tokens: int
    gated_mlp: bool
    rms_norm: bool  # HF Llama-style RMSNorm (computes in fp32); implied by a gated MLP
    flash_attention: bool
    dropout: bool
    separate_qkv: bool  # under autocast each projection saves its own 16-bit copy of the input

    @classmethod
    def of(cls, model: ModelShape) -> Shape:
        """Derive the counts from the API's ModelShape."""
        h, f = model.hidden, model.ffn_hidden
        kv_heads = model.kv_heads or model.heads
        kv_hidden = h * kv_heads // model.heads
        block = block_parameters(
            hidden=h, kv_hidden=kv_hidden, ffn=f, gated_mlp=model.gated_mlp
        )
        block = min(block, model.parameters // model.layers) if model.parameters else block
        root = max(0, model.parameters - model.layers * block)
        trainable = model.trainable
        small_per_layer = (2 * h if model.gated_mlp else 6 * h) if h < BNB_MIN_8BIT_SIZE else 0
        small = (model.layers * small_per_layer * trainable // model.parameters) if model.parameters else 0
        if model.small_parameters is not None:  # counted on the built model (profiles of user code)
            small = model.small_parameters
        return cls(
            family=model.family,
            parameters=model.parameters,
            trainable=trainable,
            small_trainable=min(small, trainable),
            largest_layer=model.largest_layer_parameters,
            block_parameters=block,
            root_parameters=root,
            buffer_bytes=model.buffer_bytes,
            layers=model.layers,
            hidden=h,
            heads=model.heads,
            kv_hidden=kv_hidden,
            ffn=f,
            vocab=model.vocab,
            tokens=model.tokens_per_sample,
            gated_mlp=model.gated_mlp,
            rms_norm=model.gated_mlp,
            flash_attention=model.flash_attention,
            dropout=model.dropout,
            separate_qkv=model.separate_qkv,
        )


def block_parameters(*, hidden: int, kv_hidden: int, ffn: int, gated_mlp: bool) -> int:
    """Parameters of one pre-norm transformer block.

    Non-gated (GPT/BERT/ViT): Q,K,V,O with biases, two-matrix MLP with biases, two LayerNorms.
    Gated (Llama/Mistral/Qwen2): Q,O and GQA K,V without biases, three-matrix MLP, two RMSNorms.
    """
    h = hidden
    if gated_mlp:
        return 2 * h * h + 2 * h * kv_hidden + 3 * h * ffn + 2 * h
    return (2 * h * h + 2 * h * kv_hidden + 2 * h + 2 * kv_hidden) + (2 * h * ffn + ffn + h) + 4 * h

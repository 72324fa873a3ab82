"""Activations: Korthikanti et al.'s per-layer count, flash attention, checkpointing, micro-batch."""

from __future__ import annotations

import pytest
from memfit.memory import Shape
from memfit.memory.activations import activation_terms
from memory_factories import LLAMA32_1B, S, hf_shape, model_shape

S_, H, A = 2048, 4096, 32  # sequence, hidden, heads


def per_layer_bytes(*, flash: bool, strategy: object) -> float:
    """Activation bytes of one transformer layer per sample (two shapes differing by one layer)."""
    common = {"hidden": H, "heads": A, "ffn_hidden": 4 * H, "vocab": 0, "tokens_per_sample": S_,
              "dropout": True, "flash_attention": flash}
    one, two = (Shape.of(model_shape(layers=n, **common)) for n in (1, 2))
    return (activation_terms(two, strategy).activation_bytes_per_sample  # type: ignore[arg-type]
            - activation_terms(one, strategy).activation_bytes_per_sample)  # type: ignore[arg-type]


def test_korthikanti_sbh_34_plus_5as_over_h_without_flash_attention() -> None:
    # Korthikanti et al. 2023, eq. (1): sbh(34 + 5as/h) bytes per layer, 16-bit activations.
    expected = S_ * H * (34 + 5 * A * S_ / H)
    assert per_layer_bytes(flash=False, strategy=S().deepspeed(2).bf16().build()) == expected


def test_flash_attention_removes_the_5as_term() -> None:
    assert per_layer_bytes(flash=True, strategy=S().deepspeed(2).bf16().build()) == S_ * H * 34


def test_fp32_doubles_everything_but_the_dropout_masks() -> None:
    # 34 = 32 bytes of 16-bit tensors + 2 one-byte masks; fp32 doubles the 32.
    assert per_layer_bytes(flash=True, strategy=S().deepspeed(2).fp32().build()) == S_ * H * (64 + 2)


CKPT = {
    "none": S().deepspeed(2).bf16().build(),
    "selective": S().deepspeed(2).bf16().ckpt("selective").build(),
    "full": S().deepspeed(2).bf16().ckpt("full").build(),
}


def test_checkpointing_lowers_activations_none_selective_full() -> None:
    shape = hf_shape(LLAMA32_1B)
    acts = {k: activation_terms(shape, s).activation_bytes_per_sample for k, s in CKPT.items()}
    assert acts["none"] > acts["selective"] > acts["full"]
    # Full checkpointing keeps 2sbh per layer (Korthikanti); what remains is mostly the 1 GiB of fp32
    # log-probs over Llama-3's 128k vocabulary.
    assert acts["full"] < 0.35 * acts["none"]


def test_full_checkpointing_keeps_each_layer_input_plus_one_layer() -> None:
    shape = Shape.of(model_shape(layers=10, vocab=0))
    full = activation_terms(shape, CKPT["full"]).activation_bytes_per_sample
    shape11 = Shape.of(model_shape(layers=11, vocab=0))
    full11 = activation_terms(shape11, CKPT["full"]).activation_bytes_per_sample
    assert full11 - full == 2 * shape.hidden * shape.tokens  # 2sbh


def test_large_vocabulary_loss_dominates_llama3_and_is_reported_as_temporaries() -> None:
    terms = activation_terms(hf_shape(LLAMA32_1B), CKPT["full"])
    vocab_tokens = 128256 * 2048
    assert terms.temporary_bytes_per_sample == 8 * vocab_tokens  # fp32 logit gradients in and out
    assert terms.activation_bytes_per_sample > 4 * vocab_tokens  # fp32 log-probs kept for backward


def test_autocast_keeps_an_fp32_residual_stream_and_16_bit_copies_per_projection() -> None:
    shape = hf_shape(LLAMA32_1B)
    ddp = activation_terms(shape, S().ddp().bf16().build()).activation_bytes_per_sample
    fsdp = activation_terms(shape, S().fsdp(3).bf16().build()).activation_bytes_per_sample
    assert ddp > fsdp


@pytest.mark.parametrize("micro_batch", [1, 2, 7])
def test_grouped_query_attention_saves_k_and_v_at_their_width(micro_batch: int) -> None:
    mha = Shape.of(model_shape(heads=32, kv_heads=None))
    gqa = Shape.of(model_shape(heads=32, kv_heads=8))
    strategy = S().deepspeed(2).bf16().mbs(micro_batch).build()
    saved = (activation_terms(mha, strategy).activation_bytes_per_sample
             - activation_terms(gqa, strategy).activation_bytes_per_sample)
    # K and V: 2 x (h - h/4) x 2 bytes per token and layer.
    assert saved == 2 * (2048 - 512) * 2 * 2048 * 24


def test_recompute_and_loss_buffers_are_separate_moments() -> None:
    # Llama-3's 128k-vocabulary loss (12 B x V per token) and one recomputed block are alive at
    # different moments of backward: two candidates, never summed.
    shape = hf_shape(LLAMA32_1B)
    full = activation_terms(shape, CKPT["full"])
    stored = 16 * 2 * 2048 + (4 * 2048 + 2 * 2048) + 2 * 2048  # block inputs, final RMSNorm, head input
    assert full.activation_bytes_per_sample == (stored + 4 * 128256) * 2048
    assert full.temporary_bytes_per_sample == 8 * 128256 * 2048
    assert full.block_activation_bytes_per_sample > stored * 2048  # the recomputed working set
    assert full.block_activation_bytes_per_sample < full.activation_bytes_per_sample
    # Without a vocabulary (a first-token classifier) the loss moment only adds the hidden state's
    # gradient; the recomputed block is the larger moment.
    no_vocab = activation_terms(Shape.of(model_shape(vocab=0)), CKPT["full"])
    assert (no_vocab.block_activation_bytes_per_sample + no_vocab.block_temporary_bytes_per_sample
            > no_vocab.activation_bytes_per_sample + no_vocab.temporary_bytes_per_sample)

"""Activations: Korthikanti et al.'s per-layer count, flash attention, checkpointing, micro-batch."""

from __future__ import annotations

import pytest
from memfit.memory import Shape
from memfit.memory.activations import activation_terms, scores_bytes
from memfit.memory.strategy import Device
from memory_factories import LLAMA32_1B, S, hf_shape, model_shape

S_, H, A = 2048, 4096, 32  # sequence, hidden, heads


def per_layer_bytes(*, flash: bool, strategy: object) -> float:
    """Activation bytes of one transformer layer per sample (two shapes differing by one layer)."""
    # Korthikanti's count is for a model whose softmax runs at the compute dtype (Megatron's fused kernel;
    # not transformers' decoders, which upcast it to fp32: test_eager_attention_scores).
    common = {"family": "encoder", "hidden": H, "heads": A, "ffn_hidden": 4 * H, "vocab": 0,
              "tokens_per_sample": S_, "dropout": True, "flash_attention": flash}
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


def _scores(family: str, strategy: object, *, dropout: bool, flash: bool = False) -> float:
    """Saved score bytes per token of one layer, in units of a·s."""
    shape = Shape.of(model_shape(family=family, hidden=H, heads=A, ffn_hidden=4 * H, vocab=0, tokens_per_sample=S_,
                                 dropout=dropout, flash_attention=flash))
    compute = 4 if strategy.config.precision == "fp32" else 2  # type: ignore[attr-defined]
    autocast = strategy.mixed_precision and strategy.config.engine == "ddp"  # type: ignore[attr-defined]
    return scores_bytes(shape, compute, cpu=strategy.device == Device.CPU, autocast=autocast) / (A * S_)  # type: ignore[attr-defined]


EAGER_SCORES = {
    # transformers' decoders: softmax(dtype=float32) saved, and its 16-bit copy for the second matmul.
    "decoder, DDP bf16 (CUDA)": ("decoder", S().bf16().build(), False, 6.0),
    "decoder, DDP fp32": ("decoder", S().fp32().build(), False, 4.0),
    "decoder, DeepSpeed bf16": ("decoder", S().deepspeed(2).bf16().build(), False, 6.0),
    # BERT: softmax at the input's dtype, except that CUDA autocast runs softmax in fp32.
    "encoder, DDP bf16 (CUDA)": ("encoder", S().bf16().build(), False, 6.0),
    "encoder, DDP bf16 (CPU)": ("encoder", S().bf16().device("cpu").build(), False, 2.0),
    "encoder, DeepSpeed bf16": ("encoder", S().deepspeed(2).bf16().build(), False, 2.0),
    # Dropout: CUDA's fused native_dropout keeps a bool mask and its 16-bit output (Korthikanti's 5as at
    # 16-bit softmax); a CPU's unfused dropout keeps a mask and an output at the softmax's dtype.
    "decoder, DDP bf16, dropout (CUDA)": ("decoder", S().bf16().build(), True, 7.0),
    "encoder, DeepSpeed bf16, dropout": ("encoder", S().deepspeed(2).bf16().build(), True, 5.0),
    "encoder, DDP fp32, dropout (CPU)": ("encoder", S().fp32().device("cpu").build(), True, 12.0),
}


@pytest.mark.parametrize(("family", "strategy", "dropout", "units"), list(EAGER_SCORES.values()), ids=list(EAGER_SCORES))
def test_eager_attention_scores(family: str, strategy: object, dropout: bool, units: float) -> None:
    assert _scores(family, strategy, dropout=dropout) == units


def test_sdpa_saves_no_scores_except_its_cpu_math_path_under_dropout() -> None:
    assert _scores("decoder", S().bf16().build(), dropout=True, flash=True) == 0.0
    assert _scores("decoder", S().bf16().device("cpu").build(), dropout=False, flash=True) == 0.0
    assert _scores("decoder", S().bf16().device("cpu").build(), dropout=True, flash=True) == 12.0


def test_eager_attention_saves_k_and_v_at_every_query_head() -> None:
    def block(flash: bool) -> float:
        shape = Shape.of(model_shape(hidden=H, heads=A, kv_heads=8, ffn_hidden=4 * H, vocab=0, tokens_per_sample=S_,
                                     flash_attention=flash))
        return activation_terms(shape, S().fp32().build()).activation_bytes_per_sample
    widened = 24 * 2 * 4 * (H - H * 8 // A) * S_  # 24 layers, K and V, fp32, from the grouped width to h
    assert block(False) - block(True) == pytest.approx(24 * 4 * A * S_ * S_ + widened)


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

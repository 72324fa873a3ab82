"""The memory terms of bf16-pure, the optimizer step in backward and the chunked loss, and the
configurations they cannot run with (docs/techniques.md)."""

from __future__ import annotations

import pytest
from memfit.memory import Shape, predict_memory, strategy_problem
from memfit.memory.activations import LOGIT_GRAD_BYTES, LOGPROB_BYTES, LOSS_CHUNKS, activation_terms
from memfit.memory.predict import memory_terms
from memfit.memory.states import model_states
from memfit.memory.temporaries import PURE_BF16_STEP_SLICE, phase_bytes
from memory_factories import S, model_shape

BIG = Shape.of(model_shape(parameters=7_000_000_000, hidden=4096, heads=32, ffn_hidden=16384, layers=32))
P = 7_000_000_000


def test_pure_bf16_holds_half_of_every_fp32_state_and_no_master() -> None:
    states = model_states(BIG, S().ddp().pure().build())
    assert (states.parameters_bytes - BIG.buffer_bytes, states.gradients_bytes, states.optimizer_bytes) == (
        2 * P, 2 * P, 4 * P)
    sharded = model_states(BIG, S().fsdp(3).pure().world(8).build())
    assert sharded.optimizer_bytes == pytest.approx(4 * P / 8)
    # bitsandbytes' 8-bit state does not halve: it is already 8 bits (fp32 for tensors too small for it).
    assert model_states(BIG, S().ddp().pure().eight_bit().build()).optimizer_bytes == pytest.approx(
        model_states(BIG, S().ddp().bf16().eight_bit().build()).optimizer_bytes)


def test_pure_bf16_saves_16_bit_activations_without_autocast_copies() -> None:
    pure, mixed = S().ddp().pure().build(), S().ddp().bf16().build()
    assert activation_terms(BIG, pure).activation_bytes_per_sample < activation_terms(BIG, mixed).activation_bytes_per_sample
    assert phase_bytes(BIG, pure).with_activations_bytes == 0.0 < phase_bytes(BIG, mixed).with_activations_bytes


def test_pure_bf16_step_scratch_is_bounded_by_one_slice() -> None:
    step = phase_bytes(BIG, S().ddp().pure().build()).step_temporary_bytes
    assert 0 < step <= 3 * 4 * PURE_BF16_STEP_SLICE


def test_optimizer_in_backward_keeps_no_gradient_in_any_phase() -> None:
    plain = predict_memory(BIG, S().ddp().bf16().ckpt("full").mbs(1).build())
    in_backward = predict_memory(BIG, S().ddp().bf16().ckpt("full").in_backward().mbs(1).build())
    assert in_backward.gradients_bytes == 0
    # 7B: 4 B/param of fp32 gradients gone, one tensor's working set left.
    assert plain.allocated_bytes - in_backward.allocated_bytes > 3.5 * P
    terms = memory_terms(BIG, S().ddp().bf16().in_backward().build())
    assert terms.step_gradient_bytes == terms.held_gradient_bytes == 0.0
    assert terms.head_step_bytes > terms.block_step_bytes > 0.0


def test_chunked_loss_never_saves_the_full_log_probabilities() -> None:
    plain = activation_terms(BIG, S().ddp().bf16().build())
    chunked = activation_terms(BIG, S().ddp().bf16().chunked().build())
    v, tokens = BIG.vocab, BIG.tokens
    assert plain.activation_bytes_per_sample - chunked.activation_bytes_per_sample == LOGPROB_BYTES * v * tokens
    assert chunked.temporary_bytes_per_sample == pytest.approx(
        ((2 + LOGPROB_BYTES + LOGIT_GRAD_BYTES) * v / LOSS_CHUNKS + 2 * BIG.hidden) * tokens)
    # The head's gradient fills in over the chunks and autocast casts the head once more.
    assert phase_bytes(BIG, S().ddp().bf16().chunked().build()).loss_extra_bytes == 6.0 * v * BIG.hidden


REFUSED = {
    "bf16-pure on DeepSpeed": (S().deepspeed(2).pure(), "DeepSpeed keeps an fp32 master copy"),
    "bf16-pure with offload": (S().fsdp(3).pure().offload("cpu"), "without offload"),
    "step in backward on FSDP": (S().fsdp(3).bf16().in_backward(), "one GPU"),
    "step in backward on two GPUs": (S().ddp().bf16().in_backward().world(2), "one GPU"),
    "step in backward accumulating": (S().ddp().bf16().in_backward().mbs(1, 4), "accumulation must be 1"),
    "step in backward in fp16": (S().ddp().in_backward(), "fp16"),
}


@pytest.mark.parametrize(("builder", "words"), REFUSED.values(), ids=REFUSED.keys())
def test_combinations_that_cannot_run_are_refused(builder: S, words: str) -> None:
    if words == "fp16":
        from memfit.api.common import Precision
        builder = builder._config(precision=Precision.FP16)
    problem = strategy_problem(builder.build())
    assert problem is not None and words in problem


def test_every_technique_together_runs() -> None:
    assert strategy_problem(S().ddp().pure().eight_bit().in_backward().chunked().ckpt("full").build()) is None

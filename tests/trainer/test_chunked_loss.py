"""Chunked loss: the same loss and gradients as the unchunked cross-entropy (builtin GPT/BERT, a Hugging Face
Llama), through every engine's wrapper, with a lower activation peak on a large vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from trainer_support import PlanBuilder, make_plan

TINY_LLAMA = {"huggingface": {"model": "memfit-test/tiny-llama", "initialize": "random", "sequenceLength": 32,
                              "config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                         "vocab_size": 128, "max_position_embeddings": 64}}}
TINY_BERT = {"builtin": {"kind": "bert", "layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "sequenceLength": 32}}
# A vocabulary much wider than the model: the logits dominate the activations.
LARGE_VOCAB = {"builtin": {"kind": "gpt", "layers": 1, "hidden": 32, "heads": 2, "vocab": 8192, "sequenceLength": 64}}


def _problem(spec: dict[str, Any] | None) -> Any:
    from memfit.api.problem import Problem
    from memfit_trainer.problems import build_problem
    from trainer_support import TINY_GPT

    return build_problem(Problem.model_validate(spec or {"builtin": TINY_GPT}))


def _loss_and_grads(problem: Any, batch: Any) -> tuple[float, dict[str, Any]]:
    problem.model.zero_grad(set_to_none=True)
    loss = problem.loss_fn(problem.model, batch)
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in problem.model.named_parameters()}


@pytest.mark.parametrize("spec", [None, TINY_BERT, TINY_LLAMA], ids=["builtin gpt", "builtin bert", "hf llama"])
def test_chunked_loss_equals_the_mean_cross_entropy(spec: dict[str, Any] | None) -> None:
    """fp32: the same loss value and the same gradient of every parameter (BERT: most labels ignored)."""
    import torch
    from memfit_trainer.chunked_loss import CHUNKS, apply_chunked_loss, loss_chunks
    from memfit_trainer.problems import BatchKey

    if spec is TINY_LLAMA:
        pytest.importorskip("transformers")
    problem = _problem(spec)
    batch = problem.make_batch(BatchKey(seed=0, step=1, sample_start=0, samples=3))
    loss, grads = _loss_and_grads(problem, batch)
    chunked = apply_chunked_loss(problem)
    assert chunked.loss_fn is not problem.loss_fn and loss_chunks(chunked.model) == CHUNKS == 8
    chunked_loss, chunked_grads = _loss_and_grads(chunked, batch)
    assert chunked_loss == pytest.approx(loss, rel=1e-5)
    assert 3 < loss < 6  # near ln(128): an untrained model, so a wrong mean would show
    for name, grad in grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


CHUNKED_ENGINES = [
    pytest.param(make_plan().ddp().batch(4, 1), id="ddp gpt"),
    pytest.param(make_plan().fsdp(3).batch(2, 2), id="fsdp3 gpt"),
    pytest.param(make_plan().deepspeed(3).batch(4, 1), id="zero3 gpt"),
    pytest.param(make_plan().ddp().bf16().batch(4, 1), id="ddp bf16 autocast gpt"),
    pytest.param(make_plan().problem(TINY_LLAMA).fsdp(3).batch(4, 1), id="fsdp3 hf llama"),
    pytest.param(make_plan().problem(TINY_LLAMA).deepspeed(3).batch(4, 1), id="zero3 hf llama"),
]


@pytest.mark.parametrize("plan", CHUNKED_ENGINES)
def test_chunked_loss_trains_the_same_through_every_engine(plan: PlanBuilder,
                                                           train_local: Callable[..., Any]) -> None:
    """The chunking runs inside the model's forward, so DDP, FSDP2 and ZeRO-3 (which gathers the head on its own
    forward hook, again for each recomputation) give the unchunked run's losses."""
    if "huggingface" in plan.wire()["problem"]:
        pytest.importorskip("transformers")
    plan = plan.optimizer("sgd").learning_rate(0.1).steps(3)
    usual = train_local(plan)
    chunked = train_local(plan.chunked_loss())
    tolerance = 2e-3 if plan.wire()["precision"] == "bf16" else 1e-5
    assert [loss for _, loss in chunked.losses] == pytest.approx([loss for _, loss in usual.losses], rel=tolerance)
    assert (chunked.facts["chunked_loss"], chunked.facts["loss_chunks"]) == (True, 8)
    assert (usual.facts["chunked_loss"], usual.facts["loss_chunks"]) == (False, 0)


def test_chunked_loss_lowers_the_activation_peak_on_a_large_vocabulary(train_local: Callable[..., Any]) -> None:
    """4 x 64 tokens x 8192 logits: unchunked, the fp32 logits, their softmax and its gradient (8 MiB each)
    exist at once; chunked, an eighth of them (CPU allocator meter, the step's peak above its start)."""
    transient = {}
    for chunked in (False, True):
        result = train_local(make_plan().problem(LARGE_VOCAB).batch(4, 1).steps(2).chunked_loss(chunked))
        transient[chunked] = result.step_memory[-1]["transient_peak_bytes"]
    assert transient[True] < 0.3 * transient[False], transient


def test_problems_without_a_token_loss_refuse_it() -> None:
    from memfit_trainer.chunked_loss import apply_chunked_loss

    vit = {"builtin": {"kind": "vit", "layers": 1, "hidden": 32, "heads": 2, "imageSize": 16, "patchSize": 8,
                       "numClasses": 4}}
    with pytest.raises(ValueError, match=r"strategy\.chunkedLoss: problem 'vit-1x32' has no language-model head"):
        apply_chunked_loss(_problem(vit))


def test_a_model_that_transforms_its_logits_refuses_it() -> None:
    """Gemma-2-style soft-capping after the head: a chunked loss over the bare head would be another loss."""
    pytest.importorskip("transformers")
    from memfit_trainer.chunked_loss import apply_chunked_loss

    problem = _problem(TINY_LLAMA)
    problem.model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match=r"strategy\.chunkedLoss: .*final_logit_softcapping"):
        apply_chunked_loss(problem)

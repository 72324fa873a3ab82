"""Hugging Face heads and attention (issue 29): the task's head is built and trains, memfit's analytic shape
counts the same parameters as transformers' model, eager attention's saved scores are what memfit's memory
model says (saved-tensor hooks on the CPU), and encoder-decoders build their decoder inputs and train."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from memfit.api.common import Precision
from memfit.api.problem import HuggingFaceProblem
from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.memory import Shape, shape_from_problem
from memfit.memory.activations import activation_terms
from memfit.memory.strategy import Device, Strategy
from memfit_trainer.problems import BatchKey, ProblemError
from memfit_trainer.problems.huggingface import build_huggingface
from memfit_trainer.profiler.harness import autocast

LLAMA = {"model_type": "llama", "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256}
BERT = {"model_type": "bert", "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 256, "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0}
GPT2 = {"model_type": "gpt2", "n_embd": 96, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 256}
T5 = {"model_type": "t5", "d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16, "vocab_size": 128,
      "decoder_start_token_id": 0}
BART = {"model_type": "bart", "d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "encoder_layers": 2,
        "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 128,
        "max_position_embeddings": 128}


def spec(config: dict[str, Any], seq: int = 32, **fields: str) -> HuggingFaceProblem:
    return HuggingFaceProblem.model_validate({"model": "memfit-test/tiny", "config": config, "sequenceLength": seq,
                                              **fields})


def trains(problem: Any) -> float:
    """Two AdamW steps; the loss of the second."""
    optimizer = torch.optim.AdamW(problem.model.parameters(), lr=1e-3)
    for step in range(2):
        loss = problem.loss_fn(problem.model, problem.make_batch(BatchKey(seed=0, step=step, samples=2,
                                                                          sample_start=0)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)


HEADS = {
    "llama sequence-classification": (LLAMA | {"num_labels": 3}, "sequence-classification",
                                      "LlamaForSequenceClassification"),
    "gpt2 sequence-classification": (GPT2, "sequence-classification", "GPT2ForSequenceClassification"),
    "bert sequence-classification": (BERT, "sequence-classification", "BertForSequenceClassification"),
    "bert masked-lm": (BERT, "masked-lm", "BertForMaskedLM"),
    "llama causal-lm": (LLAMA, "causal-lm", "LlamaForCausalLM"),
}


@pytest.mark.parametrize(("config", "task", "cls"), list(HEADS.values()), ids=list(HEADS))
def test_the_task_head_is_built_trains_and_is_counted_as_transformers_counts_it(
        config: dict[str, Any], task: str, cls: str) -> None:
    wire = spec(config, task=task)
    problem = build_huggingface(wire)
    assert type(problem.model).__name__ == cls
    assert torch.isfinite(torch.tensor(trains(problem)))
    counted = sum(p.numel() for p in problem.model.parameters())
    assert shape_from_problem(wire).parameters == counted
    assert (shape_from_problem(wire).vocab == 0) == (task == "sequence-classification")
    assert (problem.enable_chunked_loss is not None) == (task == "causal-lm")


@pytest.mark.parametrize(("config", "cls"), [(T5, "T5ForConditionalGeneration"), (BART, "BartForConditionalGeneration")],
                         ids=["t5", "bart"])
def test_an_encoder_decoder_builds_its_decoder_inputs_and_trains(config: dict[str, Any], cls: str) -> None:
    problem = build_huggingface(spec(config))
    assert type(problem.model).__name__ == cls
    assert len(problem.blocks) == 4  # the encoder's two blocks, then the decoder's
    assert problem.enable_chunked_loss is None
    loss = problem.loss_fn(problem.model, problem.make_batch(BatchKey(seed=0, step=0, samples=2, sample_start=0)))
    loss.backward()
    # Both stacks learn: the encoder's first block and the decoder's last (teacher-forced) get gradients.
    for block in (problem.blocks[0], problem.blocks[-1]):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.parameters())
    assert torch.isfinite(torch.tensor(trains(problem)))


def test_tasks_an_architecture_cannot_train_are_refused_naming_the_field() -> None:
    with pytest.raises(ProblemError, match=r"spec.problem.huggingface.task: 'memfit-test/tiny' is not an "
                                           r"encoder-decoder; seq2seq-lm needs one"):
        build_huggingface(spec(LLAMA, task="seq2seq-lm"))
    with pytest.raises(ProblemError, match=r"spec.problem.huggingface.task: .* is an encoder-decoder; causal-lm"):
        build_huggingface(spec(T5, task="causal-lm"))


def test_flash_attention_is_profiled_as_sdpa_and_refused_for_training_without_flash_attn() -> None:
    assert build_huggingface(spec(LLAMA, attention="flash")).model.config._attn_implementation == "sdpa"
    from memfit_trainer.problems.huggingface import attention_implementation

    if torch.cuda.is_available():
        pytest.skip("a GPU: flash-attn may be installed")
    with pytest.raises(ProblemError, match=r"spec\.problem\.huggingface\.attention: flash needs the flash-attn package"):
        attention_implementation(spec(LLAMA, attention="flash"), training=True)


def _saved_bytes(wire: HuggingFaceProblem, precision: Precision, samples: int) -> int:
    """Bytes autograd saves in one forward of the built model (unique storages, parameters excluded)."""
    problem = build_huggingface(wire)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    batch = problem.make_batch(BatchKey(seed=0, step=0, samples=samples, sample_start=0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision, torch.device("cpu")):
        problem.loss_fn(problem.model, batch)
    params = {p.untyped_storage().data_ptr() for p in problem.model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


def _per_sample(wire: HuggingFaceProblem, precision: Precision) -> int:
    return _saved_bytes(wire, precision, 2) - _saved_bytes(wire, precision, 1)


EAGER = {"llama (grouped K/V)": LLAMA, "llama": LLAMA | {"num_key_value_heads": 4}, "bert": BERT}


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.BF16])
@pytest.mark.parametrize("config", list(EAGER.values()), ids=list(EAGER))
@pytest.mark.parametrize("seq", [48, 96])
def test_eager_attention_saves_what_the_memory_model_adds(config: dict[str, Any], precision: Precision,
                                                          seq: int) -> None:
    """What eager attention saves beyond SDPA (its softmax, the 16-bit copy, K and V at every head), measured
    with saved-tensor hooks, is memfit's eager-minus-SDPA activation term to within SDPA's own log-sum-exp
    (4 bytes per head and token, which eager does not keep)."""
    sdpa, eager = spec(config, seq, attention="sdpa"), spec(config, seq, attention="eager")
    measured = _per_sample(eager, precision) - _per_sample(sdpa, precision)
    strategy = Strategy(config=PLAIN_FP32_DDP.model_copy(update={"precision": precision}), device=Device.CPU)
    predicted = (activation_terms(Shape.of(shape_from_problem(eager)), strategy).activation_bytes_per_sample
                 - activation_terms(Shape.of(shape_from_problem(sdpa)), strategy).activation_bytes_per_sample)
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    logsumexp = 4 * heads * seq * layers
    assert measured > 0
    assert predicted - logsumexp <= measured <= predicted

"""selective-op checkpointing in the trainer: every block recomputed under torch's selective activation
checkpointing, its matmul and attention outputs kept -- the same gradients as without checkpointing, and
exactly the saved bytes memfit.memory.activations.matmul_outputs predicts (CPU allocator meter)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from trainer_support import make_plan

GPT = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 256, "heads": 4, "vocab": 512, "sequenceLength": 64}}
LLAMA = {"huggingface": {"model": "memfit-test/tiny-llama", "initialize": "random", "sequenceLength": 32,
                         "config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "vocab_size": 128, "max_position_embeddings": 64}}}


def _problem(spec: dict[str, Any]) -> Any:
    from memfit.api.problem import Problem
    from memfit_trainer.problems import build_problem

    return build_problem(Problem.model_validate(spec))


def _checkpointed(spec: dict[str, Any], mode: str) -> Any:
    import torch
    from memfit.api.common import Checkpointing
    from memfit_trainer.strategies.checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    problem = _problem(spec)
    assert apply_activation_checkpointing(problem, Checkpointing(mode)) == (0 if mode == "none" else len(problem.blocks))
    return problem


@pytest.mark.parametrize("spec", [GPT, LLAMA], ids=["gpt", "hf-llama"])
def test_the_gradients_are_those_of_no_checkpointing(spec: dict[str, Any]) -> None:
    import torch
    from memfit_trainer.problems.base import BatchKey

    grads = {}
    for mode in ("none", "selective-op"):
        problem = _checkpointed(spec, mode)
        loss = problem.loss_fn(problem.model, problem.make_batch(BatchKey(0, 0, 0, 2)))
        loss.backward()
        grads[mode] = {n: p.grad.clone() for n, p in problem.model.named_parameters() if p.grad is not None}
    assert grads["none"].keys() == grads["selective-op"].keys()
    for name, grad in grads["none"].items():
        torch.testing.assert_close(grads["selective-op"][name], grad, msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_saved_bytes_are_the_matmul_outputs(precision: str) -> None:
    """End of forward, selective-op minus full, on one model re-wrapped with the trainer's own wrapper: per
    token and block, what `matmul_outputs` says."""
    import torch
    from memfit.api.problem import Problem
    from memfit.memory import Shape
    from memfit.memory.activations import matmul_outputs
    from memfit.memory.problems import shape_from_problem
    from memfit_trainer.meters import CpuAllocatorMeter
    from memfit_trainer.problems.base import BatchKey
    from memfit_trainer.strategies.checkpointing import MARK, checkpoint_module

    samples, saved = 8, {}
    problem = _problem(GPT)
    batch = problem.make_batch(BatchKey(0, 0, 0, samples))
    for mode in ("none", "full", "selective-op"):
        for block in problem.blocks:
            block.__dict__.pop("forward", None)
            block.__dict__.pop(MARK, None)
            if mode != "none":
                checkpoint_module(block, keep_matmuls=mode == "selective-op")
        problem.model.zero_grad(set_to_none=True)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
        with CpuAllocatorMeter() as meter, meter.region("forward"), autocast:
            loss = problem.loss_fn(problem.model, batch)
        saved[mode] = meter.results()["forward"].end_allocated_bytes
        loss.backward()
    shape = Shape.of(shape_from_problem(Problem.model_validate(GPT)))
    tokens = samples * shape.tokens
    expected = shape.layers * matmul_outputs(shape, 4 if precision == "fp32" else 2) * tokens
    assert saved["selective-op"] - saved["full"] == pytest.approx(expected, rel=1e-3), saved


def test_a_plan_with_selective_op_trains(train_local: Callable[..., Any]) -> None:
    result = train_local(make_plan().ckpt("selective-op").batch(2, 1).steps(2))
    assert result.steps == 2 and result.checkpointed_modules > 0

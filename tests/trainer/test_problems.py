"""Problems shared by trainer and profiler: builtin models, deterministic data, HF and entrypoint loading."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from memfit.api.problem import Problem
from memfit_trainer.problems import BatchKey, ProblemError, TrainingProblem, build_problem

SHAPES = {
    "gpt": {"kind": "gpt", "layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "sequenceLength": 16},
    "bert": {"kind": "bert", "layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "sequenceLength": 16},
    "vit": {
        "kind": "vit",
        "layers": 2,
        "hidden": 32,
        "heads": 4,
        "imageSize": 16,
        "patchSize": 4,
        "numClasses": 5,
    },
}


def builtin(kind: str) -> TrainingProblem:
    return build_problem(Problem.model_validate({"builtin": SHAPES[kind]}), seed=0)


@pytest.mark.parametrize("kind", SHAPES)
def test_builtin_models_expose_blocks_and_train(kind: str) -> None:
    problem = builtin(kind)
    assert len(problem.blocks) == 2
    assert all(problem.attention_of(block) is block.attn for block in problem.blocks)
    optimizer = torch.optim.AdamW(problem.model.parameters(), lr=1e-2)
    losses = []
    for step in range(1, 9):
        loss = problem.loss_fn(
            problem.model, problem.make_batch(BatchKey(seed=0, step=step, sample_start=0, samples=8))
        )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses


def test_same_seed_builds_identical_weights_on_every_rank() -> None:
    a, b = builtin("gpt"), builtin("gpt")
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name


@pytest.mark.parametrize("kind", SHAPES)
def test_a_step_holds_the_same_samples_however_it_is_split(kind: str) -> None:
    """Samples are keyed by (seed, step, index): 1 x 8 equals 4 ranks x 2 micro-batches of 1."""
    problem = builtin(kind)
    whole = problem.make_batch(BatchKey(seed=3, step=7, sample_start=0, samples=8))
    parts = [problem.make_batch(BatchKey(seed=3, step=7, sample_start=i, samples=1)) for i in range(8)]
    for name, tensor in whole.items():
        assert torch.equal(tensor, torch.cat([p[name] for p in parts])), name
    other_step = problem.make_batch(BatchKey(seed=3, step=8, sample_start=0, samples=8))
    assert not all(torch.equal(whole[n], other_step[n]) for n in whole)


def test_bert_batches_mask_some_positions_and_ignore_the_rest() -> None:
    batch = builtin("bert").make_batch(BatchKey(seed=0, step=1, sample_start=0, samples=4))
    masked = batch["labels"] != -100
    assert masked.any(dim=1).all()
    assert (batch["input_ids"][masked] == 63).all()


def test_huggingface_without_transformers_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    spec = Problem.model_validate(
        {"huggingface": {"model": "meta-llama/Llama-3.2-1B", "config": {"model_type": "llama"}}}
    )
    with pytest.raises(ProblemError, match="needs the `transformers` package"):
        build_problem(spec)


def test_huggingface_config_builds_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stand-in `transformers`: the inline config goes to AutoConfig.for_model, the model to from_config."""
    calls: dict[str, object] = {}

    class FakeConfig(types.SimpleNamespace):
        pass

    class Layers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
            self.head = torch.nn.Linear(8, 50)

        def forward(self, input_ids: torch.Tensor) -> types.SimpleNamespace:
            x = self.embed(input_ids)
            for layer in self.layers:
                x = layer(x)
            return types.SimpleNamespace(logits=self.head(x))

    def for_model(model_type: str, **values: object) -> FakeConfig:
        calls["for_model"] = (model_type, values)
        return FakeConfig(vocab_size=values["vocab_size"])

    def from_config(config: FakeConfig, **kwargs: object) -> Layers:
        calls["from_config"] = kwargs
        return Layers()

    fake = types.SimpleNamespace(
        AutoConfig=types.SimpleNamespace(for_model=for_model),
        AutoModelForCausalLM=types.SimpleNamespace(from_config=from_config),
    )
    monkeypatch.setitem(sys.modules, "transformers", fake)
    spec = Problem.model_validate(
        {
            "huggingface": {
                "model": "org/tiny",
                "config": {"model_type": "llama", "vocab_size": 50},
                "sequenceLength": 12,
            }
        }
    )
    problem = build_problem(spec)
    assert calls["for_model"] == ("llama", {"vocab_size": 50})
    assert calls["from_config"] == {"attn_implementation": "sdpa"}
    assert len(problem.blocks) == 3
    batch = problem.make_batch(BatchKey(seed=0, step=1, sample_start=0, samples=2))
    assert batch["input_ids"].shape == (2, 12)
    assert problem.loss_fn(problem.model, batch).ndim == 0


@pytest.mark.parametrize(
    ("entrypoint", "fragment"),
    [
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("json:no_such_function", "has no callable 'no_such_function'"),
        ("json:dumps", "raised TypeError"),
        ("builtins:dict", "returned dict; it must return memfit_trainer.problems.TrainingProblem"),
    ],
)
def test_bad_entrypoints_name_the_problem(entrypoint: str, fragment: str) -> None:
    with pytest.raises(ProblemError, match=fragment.replace("(", r"\(")):
        build_problem(Problem.model_validate({"entrypoint": entrypoint}))

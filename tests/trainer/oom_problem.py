"""An entrypoint problem for the tests: the builtin tiny GPT whose data source exhausts host RAM at step 2."""

from __future__ import annotations

from memfit.api.problem import BuiltinProblem
from memfit_trainer.problems import Batch, BatchKey, TrainingProblem
from memfit_trainer.problems.builtin import build_builtin

SPEC = BuiltinProblem.model_validate(
    {"kind": "gpt", "layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "sequenceLength": 16}
)


def problem() -> TrainingProblem:
    base = build_builtin(SPEC)

    def make_batch(key: BatchKey) -> Batch:
        if key.step == 2:
            raise MemoryError("host RAM exhausted while building the batch (test)")
        return base.make_batch(key)

    return TrainingProblem(
        name="oom-gpt", model=base.model, blocks=base.blocks, make_batch=make_batch, loss_fn=base.loss_fn
    )

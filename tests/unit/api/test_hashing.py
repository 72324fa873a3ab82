"""problem_hash: stable across key order and spelled-out defaults, sensitive to every shape field."""

from __future__ import annotations

import pytest
from memfit.api.hashing import canonical_problem_json, problem_hash
from memfit.api.problem import Problem

GPT = {"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}}


def test_hash_is_16_hex_digits_and_pinned() -> None:
    digest = problem_hash(Problem.model_validate(GPT))
    assert len(digest) == 16
    int(digest, 16)
    # Pinned: a change here invalidates every cached profile, so it must be deliberate.
    assert canonical_problem_json(Problem.model_validate(GPT)) == (
        '{"builtin":{"heads":4,"hidden":64,"imageSize":224,"kind":"gpt","layers":2,"numClasses":1000,'
        '"patchSize":16,"sequenceLength":1024,"vocab":32000}}'
    )


def test_key_order_and_explicit_defaults_do_not_matter() -> None:
    reordered = {"builtin": {"heads": 4, "hidden": 64, "layers": 2, "kind": "gpt", "vocab": 32000}}
    assert problem_hash(Problem.model_validate(reordered)) == problem_hash(Problem.model_validate(GPT))


@pytest.mark.parametrize(
    "change",
    [
        {"layers": 3},
        {"hidden": 128},
        {"heads": 8},
        {"vocab": 32001},
        {"sequenceLength": 512},
        {"kind": "bert"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_any_shape_change_changes_the_hash(change: dict[str, object]) -> None:
    changed = {"builtin": {**GPT["builtin"], **change}}
    assert problem_hash(Problem.model_validate(changed)) != problem_hash(Problem.model_validate(GPT))


def test_entrypoint_and_huggingface_hash() -> None:
    a = problem_hash(Problem.model_validate({"entrypoint": "pkg.mod:problem"}))
    b = problem_hash(Problem.model_validate({"entrypoint": "pkg.mod:other"}))
    c = problem_hash(
        Problem.model_validate({"huggingface": {"model": "org/m", "config": {"model_type": "llama"}}})
    )
    assert len({a, b, c}) == 3


def test_profile_cache_key_separates_optimizer_8bit_image_and_gpu() -> None:
    from memfit.api.hashing import profile_cache_key
    from memfit.api.problem import Problem

    problem = Problem.model_validate({"entrypoint": "pkg.mod:problem"})
    base = {"optimizer": "adamw", "optimizer8bit": "auto", "image": "memfit/trainer:1", "gpu_product": "l4"}
    reference = profile_cache_key(problem, **base)
    assert reference == profile_cache_key(problem, **base)
    assert len(reference) == 16
    for field, other in {"optimizer": "sgd", "optimizer8bit": "disabled", "image": "memfit/trainer:2",
                         "gpu_product": "h100"}.items():
        assert profile_cache_key(problem, **(base | {field: other})) != reference, field


def test_adapter_settings_separate_profiles_only_of_jobs_that_allow_peft() -> None:
    from memfit.api.hashing import profile_cache_key
    from memfit.api.problem import Problem

    problem = Problem.model_validate({"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4}})
    base = {"optimizer": "adamw", "optimizer8bit": "auto", "image": "img", "gpu_product": "l4"}
    plain = profile_cache_key(problem, **base)
    assert profile_cache_key(problem, **base, peft="") == plain  # other jobs keep their keys
    rank8 = profile_cache_key(problem, **base, peft='{"lora_rank":8}')
    assert rank8 != plain and rank8 != profile_cache_key(problem, **base, peft='{"lora_rank":16}')

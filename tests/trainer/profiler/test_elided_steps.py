"""Elided steps allocate what real steps allocate: peaks compared with real arithmetic, byte for byte."""

from __future__ import annotations

import pytest
from profiler_support import TINY

torch = pytest.importorskip("torch")

from memfit.api.job import OptimizerKind  # noqa: E402
from memfit.api.problem import Problem  # noqa: E402
from memfit_trainer.profiler.configs import parse_configs  # noqa: E402
from memfit_trainer.profiler.run import ProfileOptions, profile_problem  # noqa: E402

CONFIGS = parse_configs("fp32:none:1,fp32:none:4,bf16:full:2,bf16:selective:4,fp32:full:1:8bit")
# Allowed gap: scratch buffers inside skipped kernels (CPU flash attention: ~12-50 KB at these sizes).
TOLERANCE = {"gpt": 0.001, "bert": 0.001, "vit": 0.03}


def _peaks(problem: Problem, optimizer: OptimizerKind, compute: str) -> list[int]:
    options = ProfileOptions(
        configs=CONFIGS, optimizer=optimizer, compute=compute, steps_per_config=2 if compute == "full" else 1
    )
    return [m.peak_allocated_bytes for m in profile_problem(problem, options).profile.measurements]


@pytest.mark.parametrize(
    ("family", "optimizer"), [("gpt", "adamw"), ("bert", "sgd"), ("vit", "adamw")], ids=lambda v: str(v)
)
def test_elided_peaks_equal_real_peaks(family: str, optimizer: str) -> None:
    problem = Problem.model_validate(TINY[family])
    kind = OptimizerKind(optimizer)
    real = _peaks(problem, kind, "full")
    elided = _peaks(problem, kind, "elide")
    assert len(real) == len(elided) == len(CONFIGS)
    for config, want, got in zip(CONFIGS, real, elided, strict=True):
        assert want > 0
        # Never above the truth, and within the tolerance below it.
        assert got <= want + 4096, (config.key, want, got)
        assert (want - got) / want <= TOLERANCE[family], (config.key, want, got)


def test_more_samples_more_memory_and_checkpointing_saves() -> None:
    problem = Problem.model_validate(TINY["gpt"])
    configs = parse_configs("fp32:none:1,fp32:none:4,fp32:full:4")
    got = profile_problem(problem, ProfileOptions(configs=configs)).profile.measurements
    one, four, four_ckpt = (m.peak_allocated_bytes for m in got)
    assert four > one
    assert four_ckpt < four

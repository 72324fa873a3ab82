"""Depth-reduced profiles: 1 and 2 of the repeated blocks measured, the full model counted on meta,
predictions scaled to L blocks; entrypoints with, without and ignoring `depth`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from memfit.api.job import OptimizerKind
from memfit.api.problem import Problem
from memfit.api.profile import Profile
from memfit.memory import Shape, calibrate, predict_memory
from memfit.memory.calibration import _profile_strategy
from memfit.memory.strategy import Device
from memfit_trainer.problems import build_problem
from memfit_trainer.profiler.cli import main
from memfit_trainer.profiler.depth import find_repeated_blocks
from memfit_trainer.profiler.run import ProfileOptions, profile_problem
from profiler_support import write_problem

GPT6 = {"builtin": {"kind": "gpt", "layers": 6, "hidden": 128, "heads": 4, "vocab": 1024, "sequenceLength": 128}}

ENTRYPOINTS = '''
import torch
from memfit.api.problem import BuiltinProblem
from memfit_trainer.problems.builtin import build_builtin

SPEC = dict(kind="gpt", layers=6, hidden=64, heads=4, vocab=512, sequence_length=64)

def with_depth(depth=None):
    return build_builtin(BuiltinProblem(**{**SPEC, "layers": depth or SPEC["layers"]}))

def without_depth():
    return build_builtin(BuiltinProblem(**SPEC))

def ignores_depth(depth=None):
    return build_builtin(BuiltinProblem(**SPEC))

def no_blocks(depth=None):
    from memfit_trainer.problems import TrainingProblem
    model = torch.nn.Linear(8, 8)
    return TrainingProblem(name="flat", model=model, blocks=[], make_batch=lambda key: {
        "x": torch.ones(key.samples, 8)}, loss_fn=lambda m, b: m(b["x"]).sum())
'''


def test_repeated_blocks_are_found_structurally() -> None:
    problem = build_problem(Problem.model_validate(GPT6))
    blocks = find_repeated_blocks(problem.model)
    assert blocks == list(problem.model.blocks) and len(blocks) == 6
    assert find_repeated_blocks(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))) == []


def test_reduced_profile_predicts_the_full_depth_peaks() -> None:
    spec = Problem.model_validate(GPT6)
    reduced = profile_problem(spec, ProfileOptions(depth="reduced")).profile
    full = profile_problem(spec, ProfileOptions()).profile
    assert reduced.depth is not None and reduced.depth.layers == 6
    assert [r.blocks for r in reduced.depth.reduced] == [1, 2]
    assert {m.blocks for m in reduced.measurements} == {1, 2}
    assert reduced.shape == full.shape  # counted on the meta device: the full model's parameters
    assert reduced.depth.reduced[1].parameters < full.shape.parameters / 2  # never the whole model
    assert reduced.flops_per_sample == pytest.approx(full.flops_per_sample, rel=0.02)
    shape = Shape.of(full.shape)
    calibration = calibrate(reduced, shape)
    for m in full.measurements:  # the full-depth measurements are the truth of these configurations
        strategy = _profile_strategy(m, OptimizerKind.ADAMW, Device.CPU)
        predicted = predict_memory(shape, strategy, calibration=calibration).allocated_bytes
        error = predicted / m.peak_allocated_bytes - 1
        assert -0.01 <= error <= 0.03, f"{m.precision}/{m.checkpointing}/{m.micro_batch_size}: {error:+.2%}"


def _profile_entrypoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[int, Profile]:
    (tmp_path / "depth_zoo.py").write_text(ENTRYPOINTS)
    sys.modules.pop("depth_zoo", None)
    path = write_problem(tmp_path, {"entrypoint": f"depth_zoo:{name}"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MEMFIT_TERMINATION_MESSAGE_PATH", str(tmp_path / "termination"))
    code = main(["--problem", str(path), "--out", "profile.json", "--depth", "reduced", "--curves", "off"])
    return code, Profile.model_validate(json.loads((tmp_path / "profile.json").read_text()))


def test_entrypoint_with_a_depth_argument_is_profiled_reduced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, profile = _profile_entrypoint(tmp_path, monkeypatch, "with_depth")
    assert code == 0 and profile.error is None
    assert profile.depth is not None and profile.depth.layers == 6
    assert profile.shape is not None and profile.shape.layers == 6


BAD_DEPTH = {
    "no depth argument": ("without_depth", "the function takes no `depth` argument"),
    "ignores depth": ("ignores_depth", "asked for a model with 1 of its blocks, the built model has 6 block(s)"),
    "no repeated blocks": ("no_blocks", "no repeated blocks found in Linear"),
}


@pytest.mark.parametrize("case", BAD_DEPTH, ids=list(BAD_DEPTH))
def test_depth_that_cannot_be_reduced_gives_an_analytic_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    name, message = BAD_DEPTH[case]
    code, profile = _profile_entrypoint(tmp_path, monkeypatch, name)
    assert code == 0 and profile.error is None
    assert profile.compute == "analytic" and not profile.measurements
    assert profile.compute_reason is not None and message in profile.compute_reason
    assert profile.shape is not None and profile.shape.parameters > 0  # counted on the meta device


def test_a_depth_reduced_profile_is_shortened_a_configuration_at_a_time() -> None:
    from memfit.api.profile import DepthProfile, Measurement, ReducedDepth
    from memfit_trainer.profiler.emit import MAX_MESSAGE_BYTES, compact_json

    measurements = [
        Measurement(precision=p, checkpointing="none", micro_batch_size=b, peak_allocated_bytes=10**9 + b,
                    peak_backward_bytes=10**9, peak_step_bytes=10**9, step_seconds=1.25, blocks=d)
        for d in (1, 2) for p in ("fp32", "bf16") for b in range(1, 9)
    ]
    profile = Profile(problem_hash="x" * 16, measurements=measurements, depth=DepthProfile(
        layers=40, reduced=[ReducedDepth(blocks=1, parameters=10), ReducedDepth(blocks=2, parameters=20)]))
    assert len(profile.to_json()) > MAX_MESSAGE_BYTES
    kept = Profile.model_validate_json(compact_json(profile))
    assert len(compact_json(profile).encode()) <= MAX_MESSAGE_BYTES and kept.measurements
    by_depth = {d: {(m.precision, m.micro_batch_size) for m in kept.measurements if m.blocks == d} for d in (1, 2)}
    assert by_depth[1] == by_depth[2]  # every configuration kept at both depths

"""Profiles of user code: measured activation curves, data-dependent models, bad entrypoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from memfit.api.common import Checkpointing, Precision
from memfit.api.profile import Profile
from memfit.api.training_config import PLAIN_FP32_DDP
from memfit.memory import Shape, calibrate
from memfit.memory.strategy import Device, Strategy
from memfit_trainer.profiler.cli import main
from profiler_support import write_problem

ZOO = Path(__file__).resolve().parents[3] / "benchmarks" / "entrypoints"
EXIT_INVALID = 2

BAD = {
    "blocks outside the model": (
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "    stray = torch.nn.Linear(4, 4)\n"
        "    return TrainingProblem(name='bad', model=model, blocks=[stray], make_batch=lambda key: "
        "{'x': torch.zeros(key.samples, 4)}, loss_fn=lambda m, b: m(b['x']).sum())\n",
        "blocks[0] (Linear) is not a submodule of the model",
    ),
    "batch not deterministic": (
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "    return TrainingProblem(name='bad', model=model, blocks=list(model), make_batch=lambda key: "
        "{'x': torch.randn(key.samples, 4)}, loss_fn=lambda m, b: m(b['x']).sum())\n",
        "make_batch is not deterministic in its key: 'x' differs",
    ),
}


def _profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entrypoint: str, *args: str) -> tuple[int, Profile]:
    path = write_problem(tmp_path, {"entrypoint": entrypoint})
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ZOO))
    monkeypatch.setenv("MEMFIT_TERMINATION_MESSAGE_PATH", str(tmp_path / "termination"))
    code = main(["--problem", str(path), "--out", "profile.json", *args])
    return code, Profile.model_validate(json.loads((tmp_path / "profile.json").read_text()))


@pytest.mark.parametrize(("body", "message"), list(BAD.values()), ids=list(BAD))
def test_bad_entrypoints_are_input_errors_that_name_the_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, message: str
) -> None:
    (tmp_path / "bad_problem.py").write_text(
        "import torch\nfrom memfit_trainer.problems import TrainingProblem\ndef problem():\n" + body
    )
    sys.modules.pop("bad_problem", None)
    code, profile = _profile(tmp_path, monkeypatch, "bad_problem:problem", "--configs", "fp32:none:1")
    assert code == EXIT_INVALID
    assert profile.error is not None and message in profile.error
    assert profile.error.startswith("problem.entrypoint")


def test_a_cnn_profile_measures_its_activations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, profile = _profile(tmp_path, monkeypatch, "memfit_zoo:cnn_small",
                             "--configs", "fp32:none:1,fp32:none:2", "--optimizer", "sgd")
    assert code == 0, profile.error
    assert profile.optimizer == "sgd" and profile.compute == "elided" and not profile.unused_parameters
    assert len(profile.activation_curves) == 8  # fp32/bf16 x none/full x bare/held
    bare = next(c for c in profile.activation_curves
                if c.precision == "fp32" and c.checkpointing == "none" and not c.gradients_held)
    assert bare.micro_batch_sizes == [1, 2, 4, 8, 16, 32]
    assert bare.saved_bytes_per_sample and bare.saved_bytes_per_sample > 500_000  # ~1.1 MB/sample saved
    assert profile.shape is not None
    calibration = calibrate(profile, Shape.of(profile.shape))
    fit = calibration.curves[(bare.precision, bare.checkpointing, False)]
    assert fit.measured
    # The fitted slope covers what autograd saves, plus the transients around it.
    assert bare.saved_bytes_per_sample <= fit.per_sample_bytes <= 2 * bare.saved_bytes_per_sample


def test_a_top_k_router_is_profiled_with_real_arithmetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, profile = _profile(tmp_path, monkeypatch, "memfit_zoo:moe_small",
                             "--configs", "fp32:none:1,fp32:none:2", "--curves", "off")
    assert code == 0, profile.error
    assert profile.compute == "full"
    assert profile.compute_reason is not None and profile.compute_reason.startswith("elided arithmetic unsafe")
    assert len(profile.measurements) == 2


GRU_ENTRYPOINT = """
import torch
import torch.nn.functional as F
from memfit_trainer.problems import TrainingProblem


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(500, 128)
        self.gru = torch.nn.GRU(128, 64, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(128, 10)

    def forward(self, t):
        x = self.embed(t)
        return self.head((x + self.gru(x)[0]).mean(1))


def problem():
    model = Net()

    def make_batch(key):
        g = [torch.Generator().manual_seed(s) for s in key.sample_seeds()]
        return {"t": torch.stack([torch.randint(0, 500, (64,), generator=x) for x in g]),
                "y": torch.stack([torch.randint(0, 10, (), generator=x) for x in g])}

    return TrainingProblem(name="gru", model=model, blocks=[model.gru], make_batch=make_batch,
                           loss_fn=lambda m, b: F.cross_entropy(m(b["t"]), b["y"]), tokens_per_sample=64)
"""


def test_a_step_that_fails_only_when_elided_at_a_larger_batch_is_rerun_for_real(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bidirectional batch-first GRU passes the elided probe (micro-batch 2, small tensors run for
    real) but its elided step at micro-batch 8 comes back time-major; the profiler reruns the whole
    profile with real arithmetic instead of failing (found on a model from outside the repository)."""
    (tmp_path / "gru_problem.py").write_text(GRU_ENTRYPOINT)
    sys.modules.pop("gru_problem", None)
    code, profile = _profile(tmp_path, monkeypatch, "gru_problem:problem",
                             "--configs", "fp32:none:2,fp32:none:8", "--curves", "off")
    assert code == 0, profile.error
    assert profile.compute == "full"
    assert profile.compute_reason is not None and "measured step" in profile.compute_reason
    assert [m.micro_batch_size for m in profile.measurements] == [2, 8]


def test_a_precision_the_device_refuses_is_skipped_and_the_rest_of_the_profile_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32-only extension (numpy behind a custom autograd Function) refuses bf16 autocast, as a
    kernel without bf16 does: its bf16 configurations and curves are recorded as skipped with what raised;
    fp32 is measured; a bf16 prediction says its activations are analytic (no curve), fp32's measured."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    sys.modules.pop("fp32_only_problem", None)
    code, profile = _profile(tmp_path, monkeypatch, "fp32_only_problem:problem", "--curves", "on")
    assert code == 0, profile.error
    assert {(m.precision, m.checkpointing) for m in profile.measurements} == {("fp32", "none")}
    assert {(c.precision, c.checkpointing) for c in profile.activation_curves} == {("fp32", "none"), ("fp32", "full")}
    skipped = {(s.kind, s.precision, s.checkpointing) for s in profile.skipped}
    assert skipped == {("configuration", "bf16", "none"), ("configuration", "bf16", "full"),
                       ("curve", "bf16", "none"), ("curve", "bf16", "full")}
    assert all("BFloat16" in s.reason for s in profile.skipped)
    assert profile.refused() == {(Precision.BF16, Checkpointing.NONE), (Precision.BF16, Checkpointing.FULL)}
    assert profile.shape is not None
    calibration = calibrate(profile, Shape.of(profile.shape))
    sources = {p: calibration.sources(Strategy(config=PLAIN_FP32_DDP.model_copy(update={"precision": p}),
                                               device=Device.CPU))["activations"]
               for p in (Precision.FP32, Precision.BF16)}
    assert sources == {Precision.FP32: "measured", Precision.BF16: "analytic"}


def test_the_skipped_list_survives_the_4_kib_termination_message() -> None:
    """A full Profile is shortened by dropping measurements, never what the device refused (the planner's
    only way to know), even with six skipped entries at their longest."""
    from memfit.api.profile import Measurement, SkippedRun
    from memfit_trainer.profiler.emit import MAX_MESSAGE_BYTES, compact_json

    measurements = [Measurement(precision="fp32", checkpointing="none", micro_batch_size=b, peak_allocated_bytes=10**9,
                                peak_backward_bytes=10**9, peak_step_bytes=10**9, step_seconds=1.25) for b in range(1, 17)]
    skipped = [SkippedRun(kind=kind, precision=p, checkpointing=c, micro_batch_size=1, reason="E" * 120)
               for kind in ("configuration", "curve") for p, c in (("bf16", "none"), ("bf16", "full"), ("fp16", "none"))]
    profile = Profile(problem_hash="x" * 16, device="cuda:t4", measurements=measurements, skipped=skipped)
    assert len(profile.to_json()) > MAX_MESSAGE_BYTES
    kept = Profile.model_validate_json(compact_json(profile))
    assert len(compact_json(profile).encode()) <= MAX_MESSAGE_BYTES
    assert kept.skipped == skipped and kept.measurements

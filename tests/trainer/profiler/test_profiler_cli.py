"""`memfit-trainer profile`: the Profile goes to --out, stdout and the termination message; errors too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memfit.api.hashing import problem_hash
from memfit.api.problem import Problem
from memfit.api.profile import Profile
from profiler_support import TINY, run_profile_cli, write_problem

pytest.importorskip("torch")

from memfit_trainer.profiler.cli import main

EXIT_INVALID, EXIT_FAILED = 2, 3


def _outputs(tmp_path: Path, stdout: str) -> tuple[Profile, Profile, Profile]:
    out = Profile.model_validate_json((tmp_path / "profile.json").read_text())
    printed = Profile.model_validate_json(stdout.strip().splitlines()[-1])
    termination = Profile.model_validate_json((tmp_path / "termination").read_text())
    return out, printed, termination


def test_profile_of_a_tiny_gpt(tmp_path: Path) -> None:
    problem = write_problem(tmp_path, TINY["gpt"])
    code, stdout, stderr = run_profile_cli(
        [
            "--problem",
            str(problem),
            "--out",
            "profile.json",
            "--configs",
            "fp32:none:1,fp32:none:2,bf16:full:2:8bit",
        ],
        tmp_path=tmp_path,
        env={"MEMFIT_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination")},
    )
    assert code == 0, stderr
    out, printed, termination = _outputs(tmp_path, stdout)
    assert out == printed == termination
    text = (tmp_path / "termination").read_bytes()
    assert len(text) <= 4096
    assert out.error is None
    assert out.problem_hash == problem_hash(Problem.model_validate(TINY["gpt"]))
    assert out.device == "cpu"
    assert out.shape is not None
    # 2 blocks of 12h^2 + 13h, two 512 x 64 embeddings, 64 x 64 positions, final norm: counted.
    h = 64
    assert out.shape.parameters == 2 * (12 * h * h + 13 * h) + 2 * 512 * h + 64 * h + 2 * h
    assert (out.shape.layers, out.shape.hidden, out.shape.heads, out.shape.vocab) == (2, 64, 4, 512)
    assert out.shape.largest_layer_parameters == 512 * h
    assert [
        (m.precision, m.checkpointing, m.micro_batch_size, m.optimizer8bit) for m in out.measurements
    ] == [
        ("fp32", "none", 1, False),
        ("fp32", "none", 2, False),
        ("bf16", "full", 2, True),
    ]
    one, two, _ = out.measurements
    # Model states alone: fp32 weights + grads + two AdamW moments.
    assert one.peak_allocated_bytes > 16 * out.shape.parameters
    assert two.peak_allocated_bytes > one.peak_allocated_bytes
    assert all(m.step_seconds > 0 for m in out.measurements)
    assert out.flops_per_sample > 6 * out.shape.parameters * 64 * 0.5  # ~6 x params x tokens
    assert out.seconds > 0


@pytest.mark.parametrize(
    ("problem", "field"),
    [
        ({"builtin": {"kind": "lstm", "layers": 2, "hidden": 64, "heads": 4}}, "problem.builtin.kind"),
        ({"builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 3}}, "problem.builtin.heads"),
        ({"builtin": {"kind": "gpt", "layers": 0, "hidden": 64, "heads": 4}}, "problem.builtin.layers"),
        ({"entrypoint": "no_such_module_memfit:problem"}, "problem.entrypoint"),
    ],
    ids=["unknown kind", "heads", "zero layers", "entrypoint import"],
)
def test_bad_input_exits_2_with_an_error_profile(
    problem: object,
    field: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_problem(tmp_path, problem)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMFIT_TERMINATION_MESSAGE_PATH", str(tmp_path / "termination"))
    code = main(["--problem", str(path), "--out", "profile.json"])
    stdout, stderr = capsys.readouterr()
    assert code == EXIT_INVALID, stderr
    out, printed, termination = _outputs(tmp_path, stdout)
    assert out == printed == termination
    assert out.error is not None and out.error.startswith(f"{field}: ")
    assert field in stderr
    assert out.measurements == []


def test_a_model_that_cannot_run_a_step_exits_2_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "crashing_problem.py").write_text(
        "import torch\n"
        "from memfit_trainer.problems import TrainingProblem\n"
        "def problem():\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "    def loss(model, batch):\n"
        "        raise RuntimeError('user loss exploded')\n"
        "    return TrainingProblem(name='crash', model=model, blocks=list(model), "
        "make_batch=lambda key: {'x': torch.zeros(key.samples, 4)}, loss_fn=loss)\n"
    )
    path = write_problem(tmp_path, {"entrypoint": "crashing_problem:problem"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MEMFIT_TERMINATION_MESSAGE_PATH", str(tmp_path / "termination"))
    code = main(["--problem", str(path), "--out", "profile.json", "--configs", "fp32:none:1"])
    stdout, stderr = capsys.readouterr()
    # A model that raises in a real forward+backward is the spec's fault: retrying cannot help (exit 2).
    assert code == EXIT_INVALID, stderr
    out, _, _ = _outputs(tmp_path, stdout)
    assert out.error is not None
    assert out.error.startswith("problem.entrypoint: the model cannot run a training step")
    assert "user loss exploded" in out.error


def test_unwritable_termination_path_still_prints_and_writes_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_problem(tmp_path, TINY["bert"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMFIT_TERMINATION_MESSAGE_PATH", str(tmp_path / "no" / "such" / "dir" / "log"))
    code = main(["--problem", str(path), "--out", "profile.json", "--configs", "fp32:none:1"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "cannot write" in stderr
    printed = json.loads(stdout.strip().splitlines()[-1])
    assert printed["shape"]["family"] == "encoder"
    assert json.loads((tmp_path / "profile.json").read_text()) == printed


def test_lora_targets_the_model_does_not_have_fail_the_profile_with_the_field(tmp_path: Path) -> None:
    problem = write_problem(tmp_path, TINY["gpt"])
    code, _, stderr = run_profile_cli(
        ["--problem", str(problem), "--out", "profile.json", "--configs", "fp32:none:1",
         "--lora-targets", "qkv,q_proj", "--lora-rank", "8"],
        tmp_path=tmp_path,
        env={"MEMFIT_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination")},
    )
    assert code == EXIT_INVALID, stderr
    out = Profile.model_validate_json((tmp_path / "profile.json").read_text())
    assert out.error is not None
    assert out.error.startswith("strategy.peft.lora.targetModules: target modules ['q_proj']"), out.error
    assert "fc, out, proj, qkv" in out.error


def test_the_peft_variant_is_measured_when_the_job_allows_it(tmp_path: Path) -> None:
    problem = write_problem(tmp_path, TINY["gpt"])
    code, _, stderr = run_profile_cli(
        ["--problem", str(problem), "--out", "profile.json", "--configs", "fp32:none:1,bf16:none:1",
         "--lora-targets", "qkv,proj,fc,out", "--lora-rank", "4", "--peft-methods", "lora,qlora"],
        tmp_path=tmp_path,
        env={"MEMFIT_TERMINATION_MESSAGE_PATH": str(tmp_path / "termination")},
    )
    assert code == 0, stderr
    out = Profile.model_validate_json((tmp_path / "profile.json").read_text())
    peft = [(m.peft.value, m.micro_batch_size) for m in out.measurements if m.peft is not None]
    assert peft == [("lora", 1), ("lora", 2), ("qlora", 1), ("qlora", 2)]
    full = [m for m in out.measurements if m.peft is None]
    assert len(full) == 2
    lora_1 = next(m for m in out.measurements if m.peft is not None and m.micro_batch_size == 1)
    assert lora_1.peak_allocated_bytes < full[1].peak_allocated_bytes  # bf16 LoRA below the bf16 full fine-tune

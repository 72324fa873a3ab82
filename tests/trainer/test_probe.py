"""The in-process probe (memfit_trainer.probe.hooks, startup/sitecustomize.py) in real processes on CPU torch:
the steps it counts, the micro-batch it sees, its peaks against memfit's own meter, and how it stays out
of a process that did not ask for it."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest
from memfit.api import pod as contract
from memfit_trainer.probe import env as probe_env
from probe_support import PROBE_LOOP, TRAIN_LOOP, point, probe_cli
from trainer_support import PYTHON, REPO, subprocess_env

STARTUP_DIR = probe_env.STARTUP_DIR
MICRO_BATCHES = (1, 2, 4)


@pytest.fixture(scope="module")
def train_loop_ladder(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    """The example own-code loop (examples/own-code/train_loop.py) probed at micro-batches 1, 2 and 4."""
    tmp = tmp_path_factory.mktemp("ladder")
    rc, summary, stderr = probe_cli(tmp, [PYTHON, str(TRAIN_LOOP)], micro_batches="1,2,4",
                                    env={contract.ENV_CHECKPOINT_DIR: str(tmp / "checkpoints")})  # fmt: skip
    assert summary, stderr
    return rc, summary


def run_under_probe(tmp: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = subprocess_env(
        tmp, PYTHONPATH=os.pathsep.join([str(STARTUP_DIR), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run([PYTHON, *args], env=environ | env, cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def free_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])


def test_the_example_loop_is_measured_at_every_micro_batch(
    train_loop_ladder: tuple[int, dict[str, Any]],
) -> None:
    rc, summary = train_loop_ladder
    assert rc == 0
    assert summary["measuredMicroBatches"] == [1, 2, 4] and summary["findings"] == []
    points = [point(summary, b) for b in MICRO_BATCHES]
    assert [p["outcome"] for p in points] == ["measured"] * 3
    assert [p["stepsSeen"] for p in points] == [3, 3, 3]
    assert [p["fedMicroBatch"] for p in points] == list(MICRO_BATCHES)
    assert all(p["memoryMeter"] == "cpu-allocator-profiler" and p["device"] == "cpu" for p in points)
    peaks = [p["peakBytes"] for p in points]
    assert peaks[0] < peaks[1] < peaks[2], peaks
    assert all(p["firstStepPeakBytes"] > 0 and p["stepSeconds"] > 0 for p in points)


def test_the_probe_reads_what_memfits_own_meter_reads(tmp_path: Path) -> None:
    """The same loop at micro-batch 4: the probe's steady peak against memfit's CPU step meter run by the
    loop itself (same meter, same step boundary: right after the optimizer step)."""
    micro = {contract.ENV_MICRO_BATCH_SIZE: "4"}
    reference = subprocess.run([PYTHON, str(PROBE_LOOP), "--memfit-meter", "--steps", "3"],
                               env=subprocess_env(tmp_path, **micro), cwd=REPO, capture_output=True, text=True,
                               timeout=120, check=True)  # fmt: skip
    memfit_peak = statistics.median(json.loads(reference.stdout.splitlines()[-1])["peakBytes"][1:])
    rc, summary, stderr = probe_cli(tmp_path, [PYTHON, str(PROBE_LOOP)], micro_batches="4", steps=3)
    assert rc == 0, stderr
    probe_peak = point(summary, 4)["peakBytes"]
    print(f"micro-batch 4: probe {probe_peak} B, memfit's meter {memfit_peak} B")
    assert probe_peak == pytest.approx(memfit_peak, rel=0.03)


def test_a_probed_process_ends_itself_after_the_steps_asked(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = run_under_probe(
        tmp_path,
        [str(PROBE_LOOP), "--steps", "50"],
        **{
            probe_env.ENV_PROBE_OUT: str(out),
            probe_env.ENV_PROBE_STEPS: "2",
            contract.ENV_MICRO_BATCH_SIZE: "3",
        },
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["ended"] == "steps" and result["steps_wanted"] == 2
    assert [s["step"] for s in result["steps"]] == [1, 2]
    assert [s["micro_batch"] for s in result["steps"]] == [3, 3]
    assert result["forward_calls"] == 2  # the outermost Sequential only, not its three layers
    assert not list(tmp_path.glob(".result.json.*")), "the temporary file of the atomic write is left"


def test_activation_checkpointings_recomputation_is_not_a_call_of_the_script(tmp_path: Path) -> None:
    """Under torch.utils.checkpoint the model's modules run again inside backward: not the script's calls.
    Counted as such, the pending step's memory was read in the middle of the next backward (and HF Trainer
    scripts with gradient checkpointing hung there)."""
    out = tmp_path / "result.json"
    proc = run_under_probe(tmp_path, [str(PROBE_LOOP), "--mode", "checkpointed", "--steps", "50"],
                           **{probe_env.ENV_PROBE_OUT: str(out), probe_env.ENV_PROBE_STEPS: "2",
                              contract.ENV_MICRO_BATCH_SIZE: "3"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["ended"] == "steps" and [s["micro_batch"] for s in result["steps"]] == [3, 3]
    assert result["forward_calls"] == 2  # the steps' own calls; the recomputations in backward are not counted


def test_a_script_that_ends_first_leaves_its_steps_so_far(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = run_under_probe(tmp_path, [str(PROBE_LOOP), "--steps", "2"], **{probe_env.ENV_PROBE_OUT: str(out)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["ended"] == "exit" and len(result["steps"]) == 2 and result["steps_wanted"] == 3


def test_sitecustomize_does_nothing_without_the_probe_variable(tmp_path: Path) -> None:
    code = ("import sys; import torch.optim.optimizer as o, torch.nn.modules.module as m; "
            "print(len(o._global_optimizer_pre_hooks), len(m._global_forward_pre_hooks), "
            "'memfit_trainer' in sys.modules, 'sitecustomize' in sys.modules)")  # fmt: skip
    proc = run_under_probe(tmp_path, ["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "0", "False", "True"]
    assert proc.stderr == ""
    assert not list(tmp_path.glob("*.json"))


def test_sitecustomize_runs_the_one_it_shadows(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins; builtins.THEIRS = 'ran'\n")
    environ = subprocess_env(tmp_path, PYTHONPATH=os.pathsep.join([str(STARTUP_DIR), str(theirs)]))
    proc = subprocess.run([PYTHON, "-c", "import builtins; print(builtins.THEIRS)"], env=environ,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.stdout.strip() == "ran", proc.stderr


def test_a_broken_probe_never_breaks_the_script(tmp_path: Path) -> None:
    """MEMFIT_PROBE_STEPS that is not a number: one line on stderr, and the script runs unprobed."""
    out = tmp_path / "result.json"
    proc = run_under_probe(tmp_path, [str(PROBE_LOOP), "--steps", "1"],
                           **{probe_env.ENV_PROBE_OUT: str(out), probe_env.ENV_PROBE_STEPS: "three"})  # fmt: skip
    assert proc.returncode == 0
    assert "memfit probe: inactive (ValueError" in proc.stderr
    assert not out.exists()


def test_sitecustomize_spells_the_probe_variable_as_the_package_does() -> None:
    assert f'_ENV_PROBE_OUT = "{probe_env.ENV_PROBE_OUT}"' in (STARTUP_DIR / "sitecustomize.py").read_text()


def test_a_hundred_probed_steps_do_not_crash_the_process(tmp_path: Path) -> None:
    """Regression: a reading inside the optimizer's profiler range segfaulted within ~50 steps."""
    out = tmp_path / "result.json"
    env = {probe_env.ENV_PROBE_OUT: str(out), probe_env.ENV_PROBE_STEPS: "100"}
    proc = run_under_probe(tmp_path, [str(PROBE_LOOP), "--steps", "120"], **env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["ended"] == "steps" and len(result["steps"]) == 100


def test_a_deepspeed_script_steps_once_per_accumulation_boundary(tmp_path: Path) -> None:
    """The example loop under DeepSpeed ZeRO-3 (CPU, gloo), accumulation 2, small sub-groups: ZeRO-3 steps
    its torch optimizer once per sub-group, so the probe counts the engine's boundary steps instead."""
    pytest.importorskip("deepspeed")
    config = tmp_path / "deepspeed.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 10**6,
        "zero_optimization": {"stage": 3, "sub_group_size": 20000},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }))  # fmt: skip
    port = free_port()
    out = tmp_path / "result.json"
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           contract.ENV_DEVICE: "cpu", contract.ENV_DEEPSPEED_CONFIG: str(config),
           contract.ENV_CHECKPOINT_DIR: str(tmp_path / "checkpoints"), probe_env.ENV_PROBE_OUT: str(out)}  # fmt: skip
    proc = run_under_probe(tmp_path, [str(TRAIN_LOOP)], **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["ended"] == "steps" and result["steps_ended"] == 3
    assert result["forward_calls"] == 6  # 3 steps x 2 micro-batches: every boundary, and only boundaries
    assert (
        result["optimizer_steps"] > result["steps_ended"]
    )  # what counting torch.optim steps would have said
    assert [s["micro_batch"] for s in result["steps"]] == [2, 2, 2]


@pytest.mark.slow
def test_every_torchrun_rank_ends_on_the_same_step(tmp_path: Path) -> None:
    """Two gloo ranks under torchrun: each writes its own result and ends with 0; the launcher, which runs
    no model, writes nothing over rank 0's."""
    out = tmp_path / "result.json"
    env = {contract.ENV_CHECKPOINT_DIR: str(tmp_path / "checkpoints"), probe_env.ENV_PROBE_OUT: str(out)}
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())]
    proc = run_under_probe(tmp_path, [*torchrun, str(TRAIN_LOOP)], **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in (out, tmp_path / "result.json.rank1")]
    assert [r["rank"] for r in results] == [0, 1]
    assert [(r["ended"], len(r["steps"])) for r in results] == [("steps", 3), ("steps", 3)]

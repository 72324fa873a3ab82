"""The Hugging Face Trainer example (examples/own-code/hf_trainer.py) takes memfit's plan through the pod
contract: the plan's variables (memfit.kube.own_code.plan_env, what the pod gets) and the DeepSpeed config
`memfit-trainer deepspeed-config` writes (what memfit's init container runs). Real transformers, DeepSpeed
and torch on the CPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from factories import make_plan
from memfit.api import pod as contract
from memfit.api.common import Checkpointing, Precision
from memfit.kube.own_code import plan_env
from memfit_testbed.operator_helpers import free_port
from probe_support import point, probe_cli
from trainer_support import PYTHON, REPO, subprocess_env

pytestmark = [pytest.mark.trainer, pytest.mark.slow]
SCRIPT = REPO / "examples" / "own-code" / "hf_trainer.py"
PLAN = make_plan(micro_batch_size=2, gradient_accumulation_steps=2, nodes=1, gpus_per_node=1,
                 precision=Precision.FP32, activation_checkpointing=Checkpointing.FULL, optimizer8bit=False)


def _pod_env(tmp: Path, *, deepspeed: bool, steps: int) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in plan_env(PLAN)}
    env |= {contract.ENV_MAX_STEPS: str(steps), contract.ENV_DEVICE: "cpu",
            contract.ENV_CHECKPOINT_DIR: str(tmp / "checkpoints")}
    if deepspeed:
        plan_file = tmp / "plan.json"
        plan_file.write_text(PLAN.model_dump_json(by_alias=True))
        written = subprocess.run([PYTHON, "-m", "memfit_trainer.cli", "deepspeed-config", "--plan", str(plan_file),
                                  "--no-cuda"], env=subprocess_env(tmp), cwd=REPO, capture_output=True, text=True,
                                 timeout=120, check=True)  # fmt: skip
        (tmp / "deepspeed.json").write_text(written.stdout)
        env[contract.ENV_DEEPSPEED_CONFIG] = str(tmp / "deepspeed.json")
        env |= {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port())}
    return env


def _run(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([PYTHON, str(SCRIPT), "--save-every", "2"], env=subprocess_env(tmp, **env), cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_trainer_runs_memfits_deepspeed_config_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The Trainer checks that the config's batch sizes match its arguments: a script that ignored memfit's
    micro-batch or accumulation would stop here. A second run with more steps (a replaced pod) resumes."""
    first = _run(tmp_path, _pod_env(tmp_path, deepspeed=True, steps=4))
    assert first == first | {"engine": "deepspeed", "micro_batch": 2, "accumulation": 2, "world": 1,
                             "resumed_from": 0, "steps": 4}
    again = _run(tmp_path, _pod_env(tmp_path, deepspeed=True, steps=6))
    assert (again["resumed_from"], again["steps"]) == (4, 6)
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "hf-trainer").glob("checkpoint-*"))
    assert kept == ["checkpoint-4", "checkpoint-6"]  # the newest two


def test_the_probe_measures_the_trainer_at_the_micro_batches_memfit_asks(tmp_path: Path) -> None:
    """memfit's probe over the unchanged script: the Trainer feeds the micro-batch memfit set, and its
    optimizer steps are counted (no finding), with the peak growing with the micro-batch."""
    env = _pod_env(tmp_path, deepspeed=False, steps=100)
    env.pop(contract.ENV_MICRO_BATCH_SIZE)
    env.pop(contract.ENV_GRADIENT_ACCUMULATION_STEPS)
    rc, summary, stderr = probe_cli(tmp_path, [PYTHON, str(SCRIPT)], micro_batches="1,4", steps=3, timeout_s=240,
                                    env=env)
    assert rc == 0, stderr[-3000:]
    assert summary["findings"] == [], summary["findings"]
    one, four = point(summary, 1), point(summary, 4)
    assert (one["fedMicroBatch"], four["fedMicroBatch"]) == (1, 4)
    assert one["stepsSeen"] == four["stepsSeen"] == 3
    assert one["peakBytes"] < four["peakBytes"]


def test_under_the_probes_monitor_the_trainers_logged_loss_is_the_jobs(tmp_path: Path) -> None:
    """A training pod of a `spec.container` job runs the script under memfit's monitor (memfit.kube.own_code):
    the loss the Trainer logs reaches the termination message the operator reads (and the progress it serves)."""
    log = tmp_path / "termination-log"
    env = _pod_env(tmp_path, deepspeed=False, steps=3)
    proc = subprocess.run([PYTHON, "-m", "memfit_trainer.probe", "monitor", "--metrics-port", "0",
                           "--termination-log", str(log), "--", PYTHON, str(SCRIPT)],
                          env=subprocess_env(tmp_path, **env), cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = json.loads(log.read_text())
    assert message["reason"] == "Completed" and message["steps"] == 3, message
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert message["finalLoss"] > 0 and printed["steps"] == 3

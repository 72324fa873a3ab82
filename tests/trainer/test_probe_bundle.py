"""The probe from its bundle, in a process that has torch and nothing else of memfit's (no pydantic, no
memfit.api models): what memfit's profiling pod runs in a user's image (memfit_trainer.probe.bundle), with
the command's $(MEMFIT_MICRO_BATCH_SIZE) expanded per run and the compact summary in the termination log."""

from __future__ import annotations

import json
import subprocess
import sysconfig
import time
from pathlib import Path

from memfit_trainer.probe.bundle import write_bundle
from memfit_trainer.probe.expansion import escape, expand
from probe_support import PROBE_LOOP
from trainer_support import PYTHON, subprocess_env

BLOCKED = ("pydantic", "deepspeed", "transformers")


def bundle_env(tmp: Path) -> tuple[Path, dict[str, str]]:
    """The bundle, and an environment whose Python sees only it (and torch): memfit's packages from the repo
    are off the path, and importing what a user's image need not have fails."""
    bundle = tmp / "bundle"
    write_bundle(bundle)
    blocked = tmp / "blocked"
    for name in BLOCKED:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is not in the user image')\n")
    # The test venv installs memfit editable (make venv): its .pth imports a finder module that maps memfit and
    # memfit_trainer to this repository. A module of the same name earlier on the path installs nothing.
    for finder in Path(sysconfig.get_paths()["purelib"]).glob("__editable__*finder.py"):
        (blocked / finder.name).write_text("def install():\n    pass\n")
    env = subprocess_env(tmp)
    env["PYTHONPATH"] = f"{blocked}:{bundle}"
    return bundle, env


def test_the_bundle_holds_the_probe_and_only_pydantic_free_api_modules(tmp_path: Path) -> None:
    files = {str(p.relative_to(tmp_path)) for p in write_bundle(tmp_path)}
    assert {"memfit/api/pod.py", "memfit/api/termination.py", "memfit_trainer/probe/__main__.py",
            "memfit_trainer/probe/startup/sitecustomize.py", "memfit_trainer/meters/cpu.py", "memfit_probe.py"} <= files
    assert not any(f.startswith("memfit/api/") and f not in
                   ("memfit/api/__init__.py", "memfit/api/pod.py", "memfit/api/termination.py") for f in files)


def test_the_probe_runs_from_its_bundle_and_expands_the_micro_batch_per_run(tmp_path: Path) -> None:
    bundle, env = bundle_env(tmp_path)
    check = subprocess.run([PYTHON, "-c", "import memfit_trainer, memfit.api.pod; print(memfit_trainer.__file__)"],
                           env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert check.stdout.strip().startswith(str(bundle))
    refused = subprocess.run([PYTHON, "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "pydantic is not in the user image" in refused.stderr

    log = tmp_path / "termination-log"
    # As the kubelet hands it over after `$$(` in the pod spec: the literal `$(MEMFIT_MICRO_BATCH_SIZE)`.
    command = [PYTHON, str(PROBE_LOOP), "--micro-batch", "$(MEMFIT_MICRO_BATCH_SIZE)"]
    env["PYTHONPATH"] = str(tmp_path / "blocked")  # the image's own; the launcher finds its folder itself
    proc = subprocess.run(
        [PYTHON, str(bundle / "memfit_probe.py"), "--micro-batches", "1,2", "--steps", "2", "--timeout", "120",
         "--out", str(tmp_path / "summary.json"), "--termination-log", str(log), "--expand-variables", "--",
         *command], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    wire = json.loads(log.read_text())
    assert "command" not in wire and wire["findings"] == []
    assert [(p["microBatch"], p["fedMicroBatch"], p["outcome"]) for p in wire["points"]] == [
        (1, 1, "measured"), (2, 2, "measured")]
    one, two = (p["peakBytes"] for p in wire["points"])
    assert 0 < one < two  # the activations of the second sample
    assert wire["points"][0]["memoryMeter"].startswith("cpu")


def test_kubernetes_expansion_rules() -> None:
    env = {"MEMFIT_MICRO_BATCH_SIZE": "4"}
    assert expand("--bs=$(MEMFIT_MICRO_BATCH_SIZE)", env) == "--bs=4"
    assert expand("$(UNKNOWN) $$(MEMFIT_MICRO_BATCH_SIZE) $$", env) == "$(UNKNOWN) $(MEMFIT_MICRO_BATCH_SIZE) $"
    assert expand(expand(escape("--bs=$(MEMFIT_MICRO_BATCH_SIZE) $HOME"), {}), env) == "--bs=4 $HOME"


def test_each_run_gets_the_deepspeed_config_at_its_own_micro_batch(tmp_path: Path) -> None:
    from memfit_trainer.probe.driver import deepspeed_config_for

    source = tmp_path / "deepspeed.json"
    source.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                                  "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 0}}))
    env = {"MEMFIT_DEEPSPEED_CONFIG": str(source), "PET_NPROC_PER_NODE": "1"}
    run = tmp_path / "micro-batch-2"
    run.mkdir()
    deepspeed_config_for(env, 2, run)
    assert env["MEMFIT_DEEPSPEED_CONFIG"] == str(run / "deepspeed.json")
    written = json.loads((run / "deepspeed.json").read_text())
    assert (written["train_batch_size"], written["train_micro_batch_size_per_gpu"],
            written["gradient_accumulation_steps"]) == (2, 2, 1)
    assert written["zero_optimization"] == {"stage": 0}  # the rest as memfit wrote it
    untouched = {"PET_NPROC_PER_NODE": "1"}
    deepspeed_config_for(untouched, 2, run)  # no config: nothing to do
    assert untouched == {"PET_NPROC_PER_NODE": "1"}


def test_a_finding_names_the_workers_error_above_torchruns_summary() -> None:
    from memfit_trainer.probe.findings import last_lines

    worker = ["[rank0]: Traceback (most recent call last):", "[rank0]:   File \"train.py\", line 3",
              "[rank0]: ValueError: Type fp16 is not supported on your device."]
    summary = ["Failures:", "  <NO_OTHER_FAILURES>", "Root Cause (first observed failure):", "[0]:",
               "  time      : 2026-12-07_21:44:32", "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 1)",
               "  error_file: <N/A>", "============================================================"]
    tail = last_lines("\n".join([*worker, "torch.distributed.elastic...ChildFailedError:", *summary]))
    assert tail.splitlines()[0] == "[rank0]: ValueError: Type fp16 is not supported on your device."
    assert tail.splitlines()[-1] == summary[-1]
    plain = "\n".join(["a"] * 3 + ["RuntimeError: boom"])
    assert last_lines(plain) == plain  # already in the tail: nothing added


def test_the_budget_counts_from_the_pods_start_and_no_run_starts_after_it(tmp_path: Path) -> None:
    """As in memfit's profiling pod: the budget began (`started-at`) 50 s before the probe, with 62 s in all,
    so the hanging first run is killed after about 12 s and the second micro-batch never starts."""
    started = tmp_path / "started-at"
    started.write_text(f"{time.time() - 50:.3f}\n")
    env = subprocess_env(tmp_path)
    proc = subprocess.run(
        [PYTHON, "-m", "memfit_trainer.cli", "probe", "--micro-batches", "1,2", "--steps", "3", "--timeout", "600",
         "--budget", "62", "--started-at", str(started), "--out", str(tmp_path / "summary.json"), "--report-only",
         "--", PYTHON, str(PROBE_LOOP), "--mode", "hangs"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # --report-only: the findings are in the summary
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["microBatch"] for p in summary["points"]] == [1]
    (finding,) = summary["findings"]
    seconds = int(finding.split("killed after ")[1].split("s ")[0])
    assert 8 <= seconds <= 12, finding
    assert "micro-batch 2" not in proc.stderr  # never started

"""Own-code memory accuracy: memfit's prediction for a job's `spec.problem` against the per-step peak of
the user's own training script running memfit's plan (issue 31's `own-code` section).

    PYTHONPATH=operator:trainer-image:benchmarks python benchmarks/own_code_accuracy.py [--json OUT] [--cases ID,ID]

Each case is one of the example scripts (`examples/own-code/`: the Hugging Face Trainer and the plain
PyTorch loop), at one model size, run unchanged under `memfit-trainer probe` (docs/own-code.md) with the
plan's variables a pod gets (precision, activation checkpointing, 8-bit optimizer; the probe sets the
micro-batch). The truth is the probe's steady per-step peak (the median of the steps after the first), on
the CPU allocator counter started before the script builds its model: everything the script allocates
counts, its dataset and buffers included. The prediction is what the operator plans with: memfit's memory
model for the `spec.problem` a user writes for that script (an inline GPT-2 config for the Trainer, the
`builtin` GPT the example manifest names for the loop), calibrated by memfit's profile of that problem
(`memfit-trainer profile`, what the profiling Job runs), at the plan's settings, on a CPU. The analytic
model without a profile is reported beside it (`analytic`), and so is the prediction once the script itself is
probed as the operator's profiling pod probes it (`probed`: the script run under the probe at micro-batches 1
and 2 of the probed configuration, memfit.lifecycle.probe_points: bf16, no checkpointing, the 32-bit
optimizer; its peaks become measured peaks and the planner's own corrections, memfit.planner.measured, scale
each case's prediction: the probed configuration by the script's measured / predicted ratio, every other by
the largest ratio above 1). Profiling seconds are reported per problem: memfit's profiler, and the probe's runs
it adds.

Split, fixed before any figure was looked at: held out = the larger model of each script. Nothing in the
memory model was tuned on this section; both splits are reported so later tuning stays honest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "trainer-image"), str(ROOT)]

from memfit.api import pod as contract  # noqa: E402
from provenance import stamp  # noqa: E402

RESULT = ROOT / "results" / "own_code_accuracy.json"
MEASURES = ["operator/memfit/memory", "operator/memfit/api/problem.py", "operator/memfit/api/profile.py",
            "operator/memfit/api/training_config.py", "operator/memfit/planner/measured.py",
            "operator/memfit/lifecycle/probe_points.py", "trainer-image/memfit_trainer",
            "examples/own-code/hf_trainer.py", "examples/own-code/train_loop.py", "benchmarks/own_code_accuracy.py"]
SCRIPTS = {"hf-trainer": REPO / "examples" / "own-code" / "hf_trainer.py",
           "plain-loop": REPO / "examples" / "own-code" / "train_loop.py"}
PROBE_STEPS = 3
TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    split: str

    def args(self) -> list[str]:
        return ["--layers", str(self.layers), "--hidden", str(self.hidden), "--heads", str(self.heads),
                "--vocab", str(self.vocab), "--seq-len", str(self.seq)]


MODELS = (Model("gpt-4x256", 4, 256, 4, 2048, 128, "dev"), Model("gpt-6x384", 6, 384, 6, 4096, 256, "held_out"))


@dataclass(frozen=True, slots=True)
class Case:
    script: str
    model: Model
    precision: str
    checkpointing: str
    micro_batch: int

    @property
    def id(self) -> str:
        return f"{self.script}-{self.model.name}-{self.precision}-ckpt-{self.checkpointing}-mb{self.micro_batch}"

    @property
    def run_key(self) -> tuple[str, str, str, str]:
        """Cases that share one probe run (its micro-batch ladder)."""
        return self.script, self.model.name, self.precision, self.checkpointing


def all_cases() -> list[Case]:
    """Both scripts at both sizes in fp32 and bf16 autocast at two micro-batches; the Trainer (which takes
    memfit's activation checkpointing) also with full checkpointing. The loop takes no checkpointing knob."""
    out = []
    for model in MODELS:
        for script in SCRIPTS:
            for precision in ("fp32", "bf16"):
                for micro_batch in (2, 8):
                    out.append(Case(script, model, precision, "none", micro_batch))
            if script == "hf-trainer":
                out += [Case(script, model, "fp32", "full", mb) for mb in (2, 8)]
    return out


def problem_of(case: Case) -> dict[str, Any]:
    """The `spec.problem` a user writes for the script: what memfit plans with."""
    m = case.model
    if case.script == "hf-trainer":
        return {"huggingface": {"model": "example/gpt2", "initialize": "random", "sequenceLength": m.seq,
                                "config": {"model_type": "gpt2", "vocab_size": m.vocab, "n_positions": m.seq,
                                           "n_embd": m.hidden, "n_layer": m.layers, "n_head": m.heads}}}
    return {"builtin": {"kind": "gpt", "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "vocab": m.vocab,
                        "sequenceLength": m.seq}}


def problem_key(case: Case) -> str:
    return f"{case.script}-{case.model.name}"


def profile_problems(cases: list[Case], workdir: Path) -> dict[str, Any]:
    """`memfit-trainer profile` once per problem, as the operator's profiling Job runs it (AdamW, the
    scripts' optimizer)."""
    from memfit.api.profile import Profile

    profiles: dict[str, Any] = {}
    for case in cases:
        key = problem_key(case)
        if key in profiles:
            continue
        problem, out = workdir / f"problem-{key}.json", workdir / f"profile-{key}.json"
        problem.write_text(json.dumps(problem_of(case)))
        started = time.monotonic()
        env = _env(workdir, case) | {contract.ENV_TERMINATION_MESSAGE_PATH: str(workdir / f"termination-{key}")}
        proc = subprocess.run([sys.executable, "-m", "memfit_trainer.cli", "profile", "--problem", str(problem),
                               "--out", str(out), "--optimizer", "adamw"], env=env, capture_output=True, text=True,
                              timeout=1800, check=False)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"profiling {key} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        profiles[key] = Profile.model_validate_json(out.read_text())
        PROFILE_SECONDS[key] = round(time.monotonic() - started, 1)
    return profiles


PROFILE_SECONDS: dict[str, float] = {}
PROBED = ("bf16", "none", (1, 2))  # memfit.lifecycle.probe_points.probe_config on a CPU, PROBE_MICRO_BATCHES


def probe_cases(cases: list[Case]) -> list[Case]:
    """The runs the operator's profiling pod adds for each script and model: the probed configuration at
    micro-batches 1 and 2."""
    precision, ckpt, batches = PROBED
    seen = {(c.script, c.model.name): c.model for c in cases}
    return [Case(script, model, precision, ckpt, b) for (script, _), model in seen.items() for b in batches]


def probed_predict(case: Case, profile: Any, points: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The profiled prediction once the probe's points are learned, by the planner's own corrections."""
    from memfit.api.job import OptimizerKind
    from memfit.memory import Device, Shape, Strategy, calibrate
    from memfit.memory.predict import memory_terms
    from memfit.planner.measured import MeasuredPeak, PeakKind, peak_corrections

    shape = Shape.of(profile.shape)
    calibration = calibrate(profile, shape)
    peaks = []
    for probe in probe_cases([case]):
        measured = points.get(probe.id, {})
        if "truth_bytes" not in measured:
            return None
        strategy = Strategy(config=_config(probe), optimizer=OptimizerKind.ADAMW, device=Device.CPU)
        peaks.append(MeasuredPeak(strategy, measured["truth_bytes"], PeakKind.ALLOCATED))
    corrections = peak_corrections(peaks, shape, calibration=calibration)
    strategy = Strategy(config=_config(case), optimizer=OptimizerKind.ADAMW, device=Device.CPU)
    factor = corrections.factor(strategy)
    # The planner scales the tensor bytes by the factor (MemoryTerms.scaled: peak = fragmentation x allocated x
    # factor + overhead); on a CPU the allocated bytes are the whole figure.
    allocated = memory_terms(shape, strategy, calibration=calibration).allocated_bytes(case.micro_batch, 1)
    return {"bytes": int(allocated * factor), "factor": round(factor, 4)}


def _config(case: Case) -> Any:
    from memfit.api.common import Checkpointing, Engine, Offload, Precision
    from memfit.api.training_config import TrainingConfig

    return TrainingConfig(engine=Engine.DDP, zero_stage=0, precision=Precision(case.precision),
                          activation_checkpointing=Checkpointing(case.checkpointing), offload=Offload.NONE,
                          optimizer8bit=False, micro_batch_size=case.micro_batch, gradient_accumulation_steps=1)


def predict(case: Case, profile: Any | None) -> dict[str, Any]:
    """memfit's per-GPU peak (allocated bytes on a CPU) and its breakdown: calibrated by `profile`, or
    analytic without one."""
    from memfit.api.job import OptimizerKind
    from memfit.api.problem import Problem
    from memfit.memory import Device, Shape, Strategy, calibrate, predict_memory, shape_from_problem

    strategy = Strategy(config=_config(case), optimizer=OptimizerKind.ADAMW, device=Device.CPU)
    if profile is None:
        estimate = predict_memory(shape_from_problem(Problem.model_validate(problem_of(case))), strategy)
    else:
        shape = Shape.of(profile.shape)
        estimate = predict_memory(shape, strategy, calibration=calibrate(profile, shape))
    names = ("parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "temporaries_bytes")
    return {"bytes": estimate.allocated_bytes, "phase": estimate.phase,
            **{n: getattr(estimate, n) for n in names}}


def _env(workdir: Path, case: Case) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "operator"), str(REPO / "trainer-image"),
                                                      env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env |= {contract.ENV_DEVICE: "cpu", contract.ENV_PRECISION: case.precision,
            contract.ENV_ACTIVATION_CHECKPOINTING: case.checkpointing, contract.ENV_OPTIMIZER_8BIT: "false",
            contract.ENV_CHECKPOINT_DIR: str(workdir / "checkpoints"), contract.ENV_MAX_STEPS: "1000",
            contract.ENV_TERMINATION_MESSAGE_PATH: str(workdir / "termination-log")}
    return env


def measure(cases: list[Case], workdir: Path) -> dict[str, dict[str, Any]]:
    """One probe run per (script, model, precision, checkpointing), over its micro-batches."""
    runs: dict[tuple[str, str, str, str], list[Case]] = {}
    for case in cases:
        runs.setdefault(case.run_key, []).append(case)
    out: dict[str, dict[str, Any]] = {}
    for key, group in runs.items():
        first = group[0]
        folder = workdir / "-".join(key)
        folder.mkdir(parents=True, exist_ok=True)
        summary_path = folder / "probe.json"
        ladder = ",".join(str(c.micro_batch) for c in sorted(group, key=lambda c: c.micro_batch))
        command = [sys.executable, "-m", "memfit_trainer.cli", "probe", "--micro-batches", ladder,
                   "--steps", str(PROBE_STEPS), "--timeout", str(TIMEOUT_S), "--out", str(summary_path), "--",
                   sys.executable, str(SCRIPTS[first.script]), "--save-every", "100000", *first.model.args()]
        started = time.monotonic()
        proc = subprocess.run(command, env=_env(folder, first), cwd=folder, capture_output=True, text=True,
                              timeout=TIMEOUT_S * 4, check=False)  # fmt: skip
        seconds = time.monotonic() - started
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        points = {p["microBatch"]: p for p in summary.get("points", [])}
        for case in group:
            point = points.get(case.micro_batch)
            if proc.returncode != 0 or point is None or point.get("peakBytes") is None:
                out[case.id] = {"error": f"probe exit {proc.returncode}: {proc.stderr[-800:]}", "point": point}
            elif point["fedMicroBatch"] != case.micro_batch or point["finding"]:
                # The script ran another micro-batch than memfit set, or the probe saw something wrong: no truth.
                out[case.id] = {"error": f"probe: fed {point['fedMicroBatch']}, finding {point['finding']!r}",
                                "point": point}
            else:
                out[case.id] = {"truth_bytes": int(point["peakBytes"]), "first_step_bytes": point["firstStepPeakBytes"],
                                "fed_micro_batch": point["fedMicroBatch"], "finding": point["finding"],
                                "meter": point["memoryMeter"], "probe_seconds": round(seconds, 1)}
    return out


def error_pct(truth: int, predicted: int) -> float:
    """Signed error in %: negative is an under-prediction (the dangerous side)."""
    return 100.0 * (predicted - truth) / truth


def section(rows: list[dict[str, Any]], key: str = "error_pct") -> dict[str, Any]:
    """MAPE, the largest under-prediction and the median error (all %) of measured rows."""
    errors = [r[key] for r in rows if r.get(key) is not None]
    if not errors:
        return {"cases": 0, "mape": None, "max_under_pct": None, "median_error_pct": None}
    return {"cases": len(errors), "mape": round(statistics.fmean(abs(e) for e in errors), 2),
            "max_under_pct": round(max(0.0, -min(errors)), 2), "median_error_pct": round(statistics.median(errors), 2)}


def build_report(cases: list[Case], truth: dict[str, dict[str, Any]], profiles: dict[str, Any],
                 probes: dict[str, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    rows = []
    for case in cases:
        row: dict[str, Any] = {"id": case.id, "script": case.script, "model": case.model.name,
                               "split": case.model.split, "precision": case.precision,
                               "checkpointing": case.checkpointing, "micro_batch": case.micro_batch}
        measured = truth.get(case.id, {})
        predicted, analytic = predict(case, profiles.get(problem_key(case))), predict(case, None)
        profile = profiles.get(problem_key(case))
        probed = probed_predict(case, profile, probes) if profile is not None else None
        row |= {"predicted": predicted, "analytic": analytic, "probed": probed, **measured}
        if "truth_bytes" in measured:
            row["error_pct"] = round(error_pct(measured["truth_bytes"], predicted["bytes"]), 2)
            row["analytic_error_pct"] = round(error_pct(measured["truth_bytes"], analytic["bytes"]), 2)
            if probed is not None:
                row["probed_error_pct"] = round(error_pct(measured["truth_bytes"], probed["bytes"]), 2)
        rows.append(row)
    groups = {"all": rows, **{split: [r for r in rows if r["split"] == split] for split in ("dev", "held_out")}}
    for script in SCRIPTS:
        groups[script] = [r for r in rows if r["script"] == script]
        for split in ("dev", "held_out"):
            groups[f"{script}-{split}"] = [r for r in groups[script] if r["split"] == split]
    sections = {name: section(group) for name, group in groups.items()}
    analytic_sections = {name: section(group, "analytic_error_pct") for name, group in groups.items()}
    probed_sections = {name: section(group, "probed_error_pct") for name, group in groups.items()}
    # The probe's own configuration at micro-batch 2 is a probe point itself (in-sample by construction): the
    # probed figures without those cases say what the probe teaches about the configurations it did not run.
    precision, ckpt, batches = PROBED
    unprobed = {name: [r for r in group if not (r["precision"] == precision and r["checkpointing"] == ckpt
                                                and r["micro_batch"] in batches)] for name, group in groups.items()}
    probed_elsewhere = {name: section(group, "probed_error_pct") for name, group in unprobed.items()}
    profiled_elsewhere = {name: section(group) for name, group in unprobed.items()}
    seconds = {}
    for key, profile_s in PROFILE_SECONDS.items():
        probe_s = [v.get("probe_seconds") for k, v in probes.items() if k.startswith(key + "-")]
        added = max((v for v in probe_s if v is not None), default=None)  # one ladder run per problem
        seconds[key] = {"profile_s": profile_s, "probe_s": added,
                        "probed_over_profile": round((profile_s + added) / profile_s, 2) if added else None}
    return {"benchmark": "own_code_accuracy", "truth": "memfit-trainer probe, CPU allocator counter, steady step peak",
            "split_rule": "held_out = the larger model of each script (gpt-6x384); dev = gpt-4x256. Fixed before "
                          "any figure was looked at; nothing was tuned on either.",
            "sections": sections, "analytic_sections": analytic_sections, "probed_sections": probed_sections,
            "probed_sections_outside_probe_points": probed_elsewhere,
            "profiled_sections_outside_probe_points": profiled_elsewhere, "profiling_seconds": seconds, "probe_points": probes, "cases": rows}


def print_table(report: dict[str, Any]) -> None:
    nan = float("nan")
    print(f"{'case':<48} {'measured MiB':>12} {'profiled MiB':>12} {'error %':>8} {'analytic %':>10} {'probed %':>9}")
    for row in report["cases"]:
        truth = row.get("truth_bytes")
        print(f"{row['id']:<48} {truth / 2**20 if truth else nan:12.2f} {row['predicted']['bytes'] / 2**20:12.2f} "
              f"{row.get('error_pct', nan):8.2f} {row.get('analytic_error_pct', nan):10.2f} "
              f"{row.get('probed_error_pct', nan):9.2f}")
    for name, s in report["sections"].items():
        a, p = report["analytic_sections"][name], report["probed_sections"][name]
        print(f"{name:<22} cases {s['cases']:>3}  profiled: MAPE {s['mape']} max under {s['max_under_pct']}  "
              f"analytic: MAPE {a['mape']} max under {a['max_under_pct']}  "
              f"probed: MAPE {p['mape']} max under {p['max_under_pct']}")
    for name in ("all", "dev", "held_out"):
        p, q = report["probed_sections_outside_probe_points"][name], report["profiled_sections_outside_probe_points"][name]
        print(f"{name:<22} outside the probe's points: cases {p['cases']:>3}  profiled: MAPE {q['mape']} max under "
              f"{q['max_under_pct']}  probed: MAPE {p['mape']} max under {p['max_under_pct']}")
    for key, t in report["profiling_seconds"].items():
        print(f"{key:<22} profile {t['profile_s']} s, probe adds {t['probe_s']} s: x{t['probed_over_profile']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=RESULT)
    parser.add_argument("--cases", default="", help="comma-separated case ids (a subset; not a result of record)")
    args = parser.parse_args(argv)
    cases = all_cases()
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c.id in wanted]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="memfit-own-code-") as tmp:
        profiles = profile_problems(cases, Path(tmp))
        truth = measure(cases, Path(tmp))
        probes = measure(probe_cases(cases), Path(tmp) / "probes")
    report = build_report(cases, truth, profiles, probes)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["provenance"] = stamp(MEASURES)
    print_table(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

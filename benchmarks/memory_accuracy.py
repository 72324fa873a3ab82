"""Memory accuracy benchmark: memfit's per-rank peak prediction against real training on CPU, with peers.

    python benchmarks/memory_accuracy.py [--quick] [--json OUT] [--cases ID,ID...] [--section NAME]

1. Truth: each case trains for real under memfit-trainer's engine (DDP, DeepSpeed ZeRO 0-3, FSDP2)
   at world size 1 or 2 (gloo, torchrun), and every rank measures its peak with the CPU allocator's
   profiler counter (memfit_trainer.meters.cpu): the peak over steps 2-3, max over ranks.
2. memfit: `memfit-trainer profile` runs once per problem (as the operator's profiling Job does), and
   `memfit.memory` predicts every case from that Profile (calibrated) or from the shape alone.
3. Peers on the same cases: DeepSpeed's model-state estimators, accelerate's estimate-memory,
   PyTorch's MemTracker / FSDPMemTracker under FakeTensorMode (memory_accuracy_peers.py).

Prints a table and writes JSON (default benchmarks/results/memory_accuracy.json, or
memory_accuracy_quick.json with --quick): `predictors: {name: {mape, p95_abs_pct, max_under_pct,
coverage, seconds_per_prediction}}` (percentages in %; max_under_pct is the largest under-prediction,
0 when it never under-predicts) and `cases: [{id, config, truth_bytes, predictions: {name: bytes|null}}]`.
--quick: 8 single-rank cases of a small decoder in under a minute (part of the trainer test tier).
--section peft: the 37 LoRA/QLoRA cases alone (issue 20; peers skip them: none models a frozen base),
written to memory_accuracy_peft.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from memory_accuracy_cases import (  # noqa: E402
    PROBLEMS,
    Case,
    case_section,
    full_cases,
    held_out,
    quick_cases,
    section_of,
)
from provenance import stamp  # noqa: E402

DEFAULT_OUT = ROOT / "results" / "memory_accuracy.json"
QUICK_OUT = ROOT / "results" / "memory_accuracy_quick.json"
PEFT_OUT = ROOT / "results" / "memory_accuracy_peft.json"
# The sources this benchmark measures: the memory model, the contracts a prediction or a profile goes
# through (not the GPUNodePool model nor the CRD generator: no case reads a pool; nor a user's own container
# or pod template and their rules: no case runs one), the trainer and profiler that produce the truth and the
# profiles (not the probe of a user's script, which neither imports), and the benchmark itself.
_NOT_MEASURED = ("pool.py", "crdgen.py", "own_code.py", "own_code_rules.py", "pod_template.py", "pod_template_rules.py")
_API = sorted(f"operator/memfit/api/{p.name}" for p in (ROOT.parent / "operator" / "memfit" / "api").glob("*.py")
              if p.name not in _NOT_MEASURED)
_TRAINER = sorted(f"trainer-image/memfit_trainer/{p.name}" for p in (ROOT.parent / "trainer-image" / "memfit_trainer")
                  .iterdir() if p.name not in ("probe", "__pycache__"))
MEASURES = ["operator/memfit/memory", *_API, *_TRAINER,
            "benchmarks/memory_accuracy.py", "benchmarks/memory_accuracy_cases.py",
            "benchmarks/memory_accuracy_peers.py", "benchmarks/memory_accuracy_worker.py"]
WORKER = ROOT / "memory_accuracy_worker.py"
MIB = 2**20


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "memfit" / "torch_extensions"))
    env["OMP_NUM_THREADS"] = "1"
    # The entrypoint section's user code, importable as `memfit_zoo` in the profiler and the truth.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "entrypoints"), env.get("PYTHONPATH")]))
    return env


def measure_truth(cases: list[Case], workdir: Path, *, device: str = "cpu") -> dict[str, dict[str, Any]]:
    """Run every case for real, one launch per world size; per-case truth and per-rank details."""
    results: dict[str, dict[str, Any]] = {}
    # One launch per world size and section: a training job runs in its own process, and state that
    # earlier cases leave in a shared worker (library flags set by DeepSpeed/FSDP runs) changed the
    # entrypoint section's truths by up to 20 % (encoder-decoder attention) when they shared one.
    for world, section in sorted({(c.world_size, case_section(c)) for c in cases}):
        group = [c for c in cases if c.world_size == world and case_section(c) == section]
        spec = workdir / f"cases-w{world}-{section}.json"
        spec.write_text(json.dumps([{"id": c.id, "plan": c.plan_wire()} for c in group]))
        out = workdir / f"truth-w{world}-{section}"
        if world == 1:
            command = [sys.executable, str(WORKER), str(spec), str(out), "--device", device]
        else:
            command = [
                sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                str(WORKER), str(spec), str(out), "--device", device,
            ]  # fmt: skip
        started = time.perf_counter()
        proc = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=3600)
        print(f"truth: {len(group)} {section} cases at world size {world} in {time.perf_counter() - started:.0f} s")
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
        for case in group:
            ranks = [json.loads(p.read_text()) for p in sorted((out / case.id).glob("rank-*.json"))]
            errors = [r["error"] for r in ranks if "error" in r]
            if errors or len(ranks) != world:
                results[case.id] = {
                    "error": errors[0] if errors else f"{len(ranks)} of {world} ranks reported"
                }
                print(f"truth: {case.id}: {results[case.id]['error']}", file=sys.stderr)
                continue
            results[case.id] = {
                "truth_bytes": max(r["peak_bytes"] for r in ranks),
                "reserved_bytes": _max_known([r.get("peak_reserved_bytes") for r in ranks]),
                "device_bytes": _max_known([r.get("peak_device_bytes") for r in ranks]),
                "ranks": ranks,
            }
    return results


def _max_known(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def profile_args(key: str) -> list[str]:
    """Profiler options of a profile key: the depth section's profiles measure 1 and 2 blocks."""
    depth = section_of(key.split(":")[0]) == "depth" and not key.endswith(":full")
    return ["--depth", "reduced"] if depth else []


def profile_key(case: Case) -> str:
    """Which profile predicts a case: per problem, and for user code per optimizer (the profiling Job
    runs the job's optimizer; builtin problems keep the AdamW profile their calibration was built on)."""
    if case_section(case) == "entrypoint":
        return f"{case.family}:{case.optimizer}"
    return f"{case.family}:adamw"


def profile_problems(keys: set[str], workdir: Path, *, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """`memfit-trainer profile` once per problem (and optimizer), as the operator's profiling Job runs it."""
    from memfit.api.profile import Profile

    profiles: dict[str, Any] = {}
    for key in sorted(keys):
        family, optimizer = key.split(":")[:2]
        problem = workdir / f"problem-{family}.json"
        problem.write_text(json.dumps(PROBLEMS[family]))
        out = workdir / f"profile-{key.replace(':', '-')}.json"
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "memfit_trainer.cli",
                "profile",
                "--problem",
                str(problem),
                "--out",
                str(out),
                "--optimizer",
                optimizer,
                *profile_args(key),
            ],
            env={**_env(), "MEMFIT_TERMINATION_MESSAGE_PATH": str(workdir / f"termination-{family}")},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"profiling {key} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        profiles[key] = {"profile": Profile.model_validate_json(out.read_text()), "wall_seconds": wall}
        print(f"profile: {key} in {wall:.1f} s wall")
    return profiles


def predict_all(cases: list[Case], profiles: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every predictor on every case: {predictor: {case id: Prediction}}."""
    from memory_accuracy_peers import PEERS, Prediction, memfit_predictor

    out: dict[str, dict[str, Any]] = {"memfit": {}}
    memfit = {key: memfit_predictor(p["profile"]) for key, p in profiles.items()}
    for case in cases:
        out["memfit"][case.id] = memfit[profile_key(case)](case)
    full = {key.removesuffix(":full"): predictor for key, predictor in memfit.items() if key.endswith(":full")}
    if full:  # the depth section, predicted from a full-depth profile too (what reduction costs)
        out["memfit-full-depth-profile"] = {
            c.id: full[profile_key(c)](c) if profile_key(c) in full else Prediction(None, 0.0) for c in cases
        }
    for name, peer in PEERS.items():
        out[name] = {}
        for case in cases:
            # Peers need a builtin model, and none models a frozen base (they would predict the full
            # fine-tune of a PEFT case) nor bf16-pure, a step in backward or a chunked loss.
            if case_section(case) in ("entrypoint", "peft", "techniques"):
                out[name][case.id] = Prediction(None, 0.0)
                continue
            try:
                out[name][case.id] = peer(case)
            except Exception as error:  # a peer crashing on a case is a case it cannot handle
                print(f"{name}: {case.id}: {type(error).__name__}: {error}", file=sys.stderr)
                out[name][case.id] = Prediction(None, 0.0)
    return out


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarise(pairs: list[tuple[int, int]], seconds: list[float]) -> dict[str, Any]:
    """MAPE, P95 |error|, largest under-prediction (all in %), coverage, mean seconds per prediction."""
    if not pairs:
        return {"mape": None, "p95_abs_pct": None, "max_under_pct": None, "coverage": 0,
                "seconds_per_prediction": None}  # fmt: skip
    errors = [100.0 * (pred - truth) / truth for truth, pred in pairs]
    abs_errors = [abs(e) for e in errors]
    return {
        "mape": round(sum(abs_errors) / len(abs_errors), 3),
        "p95_abs_pct": round(percentile(abs_errors, 0.95), 3),
        "max_under_pct": round(max(0.0, -min(errors)), 3),
        "coverage": len(pairs),
        "seconds_per_prediction": sum(seconds) / len(seconds) if seconds else None,
    }


def build_report(
    cases: list[Case], truth: dict[str, Any], predictions: dict[str, dict[str, Any]], profiles: dict[str, Any]
) -> dict[str, Any]:
    measured = [c for c in cases if "truth_bytes" in truth.get(c.id, {})]
    predictors: dict[str, Any] = {}
    for name, by_case in predictions.items():
        pairs, seconds = [], []
        for case in measured:
            p = by_case[case.id]
            if p.bytes is not None:
                pairs.append((truth[case.id]["truth_bytes"], p.bytes))
                seconds.append(p.seconds)
        predictors[name] = summarise(pairs, seconds)
    sections: dict[str, Any] = {}
    groups = {
        "transformer": [c for c in measured if case_section(c) == "transformer"],
        "entrypoint": [c for c in measured if case_section(c) == "entrypoint"],
        "entrypoint-in-sample": [c for c in measured if case_section(c) == "entrypoint" and not held_out(c.family)],
        "entrypoint-held-out": [c for c in measured if case_section(c) == "entrypoint" and held_out(c.family)],
        "peft": [c for c in measured if case_section(c) == "peft"],
        "peft-lora": [c for c in measured if case_section(c) == "peft" and c.peft == "lora"],
        "peft-qlora": [c for c in measured if case_section(c) == "peft" and c.peft == "qlora"],
        "depth-reduced": [c for c in measured if case_section(c) == "depth"],
        "depth-reduced-in-sample": [c for c in measured if case_section(c) == "depth" and not held_out(c.family)],
        "depth-reduced-held-out": [c for c in measured if case_section(c) == "depth" and held_out(c.family)],
        "techniques": [c for c in measured if case_section(c) == "techniques"],
        "techniques-in-sample": [c for c in measured if case_section(c) == "techniques" and not held_out(c.family)],
        "techniques-held-out": [c for c in measured if case_section(c) == "techniques" and held_out(c.family)],
        "technique-bf16-pure": [c for c in measured if case_section(c) == "techniques" and c.precision == "bf16-pure"],
        "technique-optimizer-in-backward": [c for c in measured if case_section(c) == "techniques" and c.in_backward],
        "technique-chunked-loss": [c for c in measured if case_section(c) == "techniques" and c.chunked],
        "technique-optimizer-implementation": [c for c in measured if case_section(c) == "techniques"
                                               and c.implementation],
        "technique-selective-op": [c for c in measured if case_section(c) == "techniques"
                                   and c.checkpointing == "selective-op" and not c.act_offload],
        "technique-activation-offload": [c for c in measured if case_section(c) == "techniques" and c.act_offload],
        "huggingface": [c for c in measured if case_section(c) == "huggingface"],
        "huggingface-in-sample": [c for c in measured if case_section(c) == "huggingface" and not held_out(c.family)],
        "huggingface-held-out": [c for c in measured if case_section(c) == "huggingface" and held_out(c.family)],
    }
    for section, members in groups.items():
        pairs = [(truth[c.id]["truth_bytes"], predictions["memfit"][c.id].bytes) for c in members
                 if predictions["memfit"][c.id].bytes is not None]
        if pairs:
            summary = summarise(pairs, [])
            sections[section] = {"mape": summary["mape"], "p95_abs_pct": summary["p95_abs_pct"],
                                 "max_under_pct": summary["max_under_pct"], "cases": len(pairs)}
    # Activation offload's host side: the most the offload's host copies held (max over ranks) against the predicted
    # host RAM per GPU (on a CPU the moved bytes themselves, no pinned-allocator rounding).
    host_pairs = [(h, predictions["memfit"][c.id].detail["host_bytes"]) for c in groups["technique-activation-offload"]
                  if (h := _host_truth(truth[c.id])) and predictions["memfit"][c.id].detail]
    if host_pairs:
        summary = summarise(host_pairs, [])
        sections["technique-activation-offload-host"] = {
            "mape": summary["mape"], "p95_abs_pct": summary["p95_abs_pct"], "max_under_pct": summary["max_under_pct"],
            "cases": len(host_pairs)}
    versus: dict[str, Any] = {}
    for name in predictions:
        if name.startswith("memfit"):
            continue
        covered = [c for c in measured if predictions[name][c.id].bytes is not None]
        memfit_pairs = [(truth[c.id]["truth_bytes"], predictions["memfit"][c.id].bytes) for c in covered]
        peer = predictors[name]
        mine = summarise(memfit_pairs, [predictions["memfit"][c.id].seconds for c in covered])
        speedup = (
            peer["seconds_per_prediction"] / mine["seconds_per_prediction"]
            if covered and mine["seconds_per_prediction"]
            else None
        )
        versus[name] = {
            "cases": len(covered),
            "memfit_mape": mine["mape"],
            "peer_mape": peer["mape"],
            "memfit_minus_peer_pp": None if not covered else round(mine["mape"] - peer["mape"], 3),
            # Per new configuration, peer seconds / memfit seconds (< 1: the peer is faster arithmetic).
            "speedup": None if speedup is None else float(f"{speedup:.3g}"),
        }
    return {
        "benchmark": "memory_accuracy",
        "truth": "CPU allocator peak (torch.profiler profile_memory counter), max over ranks, steps 2-3",
        "environment": _environment(),
        "problems": {f: PROBLEMS[f] for f in sorted({c.family for c in cases})},
        "profiles": {
            f: {"wall_seconds": round(p["wall_seconds"], 2), "profile": json.loads(p["profile"].to_json())}
            for f, p in profiles.items()
        },
        "predictors": predictors,
        "sections": sections,
        "versus_peers": versus,
        "cases": [
            {
                "id": c.id,
                "config": c.config(),
                "truth_bytes": truth.get(c.id, {}).get("truth_bytes"),
                **({"truth_error": truth[c.id]["error"]} if "error" in truth.get(c.id, {}) else {}),
                "truth_rank_bytes": [r["peak_bytes"] for r in truth.get(c.id, {}).get("ranks", [])],
                # Which phase the truth's peak is in: forward+backward vs the optimizer step (max over ranks).
                "truth_phase_bytes": _phase_bytes(truth.get(c.id, {}).get("ranks", [])),
                **({"truth_host_bytes": _host_truth(truth[c.id])} if c.act_offload and c.id in truth else {}),
                "predictions": {name: predictions[name][c.id].bytes for name in predictions},
                "memfit_breakdown": predictions["memfit"][c.id].detail,
            }
            for c in cases
        ],
    }


def _host_truth(case_truth: dict[str, Any]) -> int | None:
    """The most host memory activation offload's copies held on any rank (None when not measured)."""
    found = [r["host_peak_bytes"] for r in case_truth.get("ranks", []) if r.get("host_peak_bytes") is not None]
    return max(found) if found else None


def _phase_bytes(ranks: list[dict[str, Any]]) -> dict[str, int] | None:
    keys = ("backward_peak_bytes", "optimizer_peak_bytes")
    if not ranks or not all(k in r for r in ranks for k in keys):
        return None
    return {k.removesuffix("_peak_bytes"): max(r[k] for r in ranks) for k in keys}


def _environment() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    for module in ("torch", "deepspeed", "bitsandbytes", "accelerate"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            versions[module] = None
    versions["cpus"] = os.cpu_count()
    versions["memfit_commit"] = _git("rev-parse", "--short", "HEAD")
    # The predictor is measured as it is in the working tree: say whether that differs from the commit.
    versions["memfit_memory_modified"] = bool(_git("status", "--porcelain", "--", "operator/memfit/memory"))
    return versions


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def print_table(report: dict[str, Any]) -> None:
    names = list(report["predictors"])
    width = max(len(c["id"]) for c in report["cases"])
    print(f"\n{'case':<{width}} {'truth MiB':>10} " + " ".join(f"{n[:14]:>15}" for n in names))
    for case in report["cases"]:
        truth = case["truth_bytes"]
        cells = []
        for name in names:
            pred = case["predictions"][name]
            if pred is None or truth is None:
                cells.append(f"{'-':>15}")
            else:
                cells.append(f"{pred / MIB:8.1f} {100 * (pred - truth) / truth:+5.1f}%")
        truth_cell = f"{truth / MIB:10.1f}" if truth else f"{'error':>10}"
        print(f"{case['id']:<{width}} {truth_cell} " + " ".join(cells))
    print(
        f"\n{'predictor':<16} {'MAPE %':>8} {'P95 %':>8} {'max under %':>12} {'cases':>6} {'s/prediction':>13}"
    )
    for name, s in report["predictors"].items():
        if not s["coverage"]:
            print(f"{name:<16} {'-':>8} {'-':>8} {'-':>12} {0:>6} {'-':>13}")
            continue
        print(
            f"{name:<16} {s['mape']:8.2f} {s['p95_abs_pct']:8.2f} {s['max_under_pct']:12.2f} {s['coverage']:6d}"
            f" {s['seconds_per_prediction']:13.2e}"
        )
    print(f"\n{'memfit section':<22} {'MAPE %':>8} {'P95 %':>8} {'max under %':>12} {'cases':>6}")
    for name, s in report["sections"].items():
        print(f"{name:<22} {s['mape']:8.2f} {s['p95_abs_pct']:8.2f} {s['max_under_pct']:12.2f} {s['cases']:6d}")
    print(
        f"\n{'memfit vs peer':<16} {'cases':>6} {'memfit MAPE':>12} {'peer MAPE':>10} {'diff pp':>8} {'speedup':>9}"
    )
    for name, v in report["versus_peers"].items():
        if not v["cases"]:
            continue
        print(
            f"{name:<16} {v['cases']:6d} {v['memfit_mape']:12.2f} {v['peer_mape']:10.2f} "
            f"{v['memfit_minus_peer_pp']:+8.2f} {v['speedup']:8.3g}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 single-rank cases, under a minute")
    parser.add_argument("--json", type=Path, default=None, help="output JSON (default: benchmarks/results/)")
    parser.add_argument("--cases", default="", help="comma-separated case ids to run (default: all)")
    parser.add_argument("--section", choices=("all", "transformer", "entrypoint", "depth", "peft", "techniques", "huggingface"),
                        default="all",
                        help="run only one section's cases (peft writes memory_accuracy_peft.json)")
    args = parser.parse_args(argv)
    cases = quick_cases() if args.quick else full_cases()
    if args.section != "all":
        cases = [c for c in cases if case_section(c) == args.section]
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c.id in wanted]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memfit-accuracy-") as tmp:
        workdir = Path(tmp)
        keys = {profile_key(c) for c in cases}
        # Depth-section problems are profiled at full depth too, to show what the reduction costs.
        keys |= {f"{k}:full" for k in keys if section_of(k.split(":")[0]) == "depth"}
        profiles = profile_problems(keys, workdir)
        truth = measure_truth(cases, workdir)
    predictions = predict_all(cases, profiles)
    report = build_report(cases, truth, predictions, profiles)
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["mode"] = "quick" if args.quick else "full"
    report["provenance"] = stamp(MEASURES)
    print_table(report)
    out = args.json or (QUICK_OUT if args.quick else PEFT_OUT if args.section == "peft" else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

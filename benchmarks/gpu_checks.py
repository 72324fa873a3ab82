"""GPU memory checks: the accuracy comparison with CUDA truth, for a session that has a GPU.

    python benchmarks/gpu_checks.py [--json OUT] [--quick] [--memtracker]

Skips cleanly without CUDA: prints why and exits 0, writing nothing.

On a GPU (shared/reference/memory-model.md §9):
- truth per case: T1 `torch.cuda.max_memory_allocated`, T2 `max_memory_reserved`, T3 the NVML
  per-process peak (sampled every 10 ms; pynvml / nvidia-ml-py when installed), peak over steps 2-3,
  measured by memory_accuracy_worker.py with the CUDA meter in one process (world size 1: one GPU
  cannot hold two NCCL ranks; multi-GPU predictions stay unvalidated here);
- memfit: `memfit-trainer profile --device cuda` (real steps, CUDA meter) once per problem, then
  `memfit.memory` calibrated from it: its allocated bytes against T1, its device peak (fragmentation
  and CUDA context/cuBLAS/NCCL overhead added) against T3;
- peers against T1: DeepSpeed's estimators, accelerate's estimator, and with --memtracker
  MemTracker / FSDPMemTracker under FakeTensorMode on the CPU (minutes for 124M+ models).

Writes benchmarks/results/memory_accuracy_gpu.json (or --json) with the environment (GPU, driver,
library versions, allocator and NCCL settings), the per-truth summaries and every case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "results" / "memory_accuracy_gpu.json"
ENV_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_NVLS_ENABLE", "NCCL_BUFFSIZE", "CUBLAS_WORKSPACE_CONFIG")


def cuda_available() -> tuple[bool, str]:
    """Whether torch sees a CUDA device, and why not."""
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False (no GPU or no CUDA driver)"
    return True, torch.cuda.get_device_name(0)


def gpu_environment() -> dict[str, Any]:
    """GPU, driver and library versions, and the settings that change GPU memory use."""
    import torch

    env: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_total_bytes": torch.cuda.get_device_properties(0).total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "settings": {k: os.environ.get(k) for k in ENV_KEYS},
    }
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        env["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        env["nvidia_smi"] = None
    for module in ("deepspeed", "bitsandbytes", "accelerate", "pynvml"):
        try:
            env[module] = getattr(__import__(module), "__version__", "installed")
        except Exception:
            env[module] = None
    return env


def _device_predictions(cases: list[Any], profiles: dict[str, Any]) -> dict[str, int]:
    """memfit's full device peak (what NVML should show) per case."""
    from memfit.api.job import OptimizerKind
    from memfit.memory import Shape, calibrate, predict_memory
    from memory_accuracy_peers import _strategy

    out: dict[str, int] = {}
    for case in cases:
        profile = profiles[case.family]["profile"]
        shape = Shape.of(profile.shape)
        calibration = calibrate(profile, shape, optimizer=OptimizerKind.ADAMW)
        out[case.id] = predict_memory(shape, _strategy(case), calibration=calibration).peak_bytes
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT, help="output JSON")
    parser.add_argument("--quick", action="store_true", help="the first 6 cases only (one problem)")
    parser.add_argument("--memtracker", action="store_true", help="also trace MemTracker peers (slow)")
    args = parser.parse_args(argv)
    ok, why = cuda_available()
    if not ok:
        print(f"gpu_checks: skipped: {why}")
        return 0

    import memory_accuracy as bench
    import memory_accuracy_peers as peers
    from memory_accuracy_cases import gpu_cases
    from memory_accuracy_peers import PEERS
    from provenance import stamp

    cases = gpu_cases()[:6] if args.quick else gpu_cases()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memfit-gpu-checks-") as tmp:
        workdir = Path(tmp)
        peers.TRUTH_DEVICE = "cuda"  # memfit predicts the CUDA rules for CUDA truth
        profiles = bench.profile_problems({c.family for c in cases}, workdir, extra=("--device", "cuda"))
        truth = bench.measure_truth(cases, workdir, device="cuda")
    if not args.memtracker:
        PEERS.pop("memtracker", None)
    predictions = bench.predict_all(cases, profiles)
    report = bench.build_report(cases, truth, predictions, profiles)
    report["truth"] = "T1 torch.cuda.max_memory_allocated, max over steps 2-3 (world size 1)"
    device_peaks = _device_predictions(cases, profiles)
    pairs_t2, pairs_t3 = [], []
    for entry, case in zip(report["cases"], cases, strict=True):
        t = truth.get(case.id, {})
        entry["t1_allocated_bytes"] = t.get("truth_bytes")
        entry["t2_reserved_bytes"] = t.get("reserved_bytes")
        entry["t3_nvml_bytes"] = t.get("device_bytes")
        entry["memfit_device_peak_bytes"] = device_peaks[case.id]
        if t.get("reserved_bytes"):
            pairs_t2.append((t["reserved_bytes"], device_peaks[case.id]))
        if t.get("device_bytes"):
            pairs_t3.append((t["device_bytes"], device_peaks[case.id]))
    report["memfit_device_peak_vs_t2_reserved"] = bench.summarise(pairs_t2, [])
    report["memfit_device_peak_vs_t3_nvml"] = bench.summarise(pairs_t3, [])
    report["environment"] = {**report["environment"], **gpu_environment()}
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["mode"] = "gpu-quick" if args.quick else "gpu"
    report["provenance"] = stamp([*bench.MEASURES, "benchmarks/gpu_checks.py"])
    bench.print_table(report)
    print(f"\nmemfit device peak vs T3 NVML: {report['memfit_device_peak_vs_t3_nvml']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.json} ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

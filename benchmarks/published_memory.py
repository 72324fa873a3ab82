"""Published GPU peak memory against `memfit estimate`, row by row, as a user would pin each run.

    PYTHONPATH=operator:benchmarks python benchmarks/published_memory.py [--json OUT] [--quiet]

Each row of benchmarks/data/published_memory.json is a training run whose peak GPU memory a well-known
open-source trainer, library or guide published (docs/published-memory.md says how the rows were chosen,
cited and split). The benchmark turns the row into the `memfit estimate` command a user would type (the
model's config.json inline, the published sequence length, micro-batch, accumulation, GPUs, precision,
checkpointing, engine and ZeRO stage, offload, optimizer, LoRA/QLoRA, the memory techniques), runs it
in-process, and compares the level the source reports: `allocated` (torch.cuda.max_memory_allocated),
`reserved` (max_memory_reserved) or `device-used` (nvidia-smi) with memfit's `allocatedBytes`,
`reservedBytes` or `peakBytes`; a row whose level the source does not say is compared with `reservedBytes`
(what most trainers' "peak memory" logs read) and counted apart.

A row that memfit expresses only approximately (its `approximations`: e.g. torchtitan's every-other-matmul
selective checkpointing as memfit's selective-op) is predicted and marked. A row that states something memfit cannot express (torch.compile, activation offload, fp8, Adafactor, a
kernel library's fused layers) is not predicted: its reason is listed, and the count is part of the result.

Every row is in-sample for this repository: the table was built by memfit's developers (issue #29 keeps
its own held-out table). Within it, `split` keeps whole sources apart (`split_rule`), fixed before any
prediction was looked at, so a later change tuned on the `dev` rows still has untouched rows to show.
It runs in seconds (the memory model only); its result goes stale with the memory model, the API and the
`estimate` command (MEASURES), and a rerun is the whole refresh.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from provenance import stamp

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "benchmarks" / "data" / "published_memory.json"
RESULT = REPO / "benchmarks" / "results" / "published_memory.json"
MEASURES = ["operator/memfit/memory", "operator/memfit/api", "operator/memfit/cli/estimate.py",
            "benchmarks/published_memory.py", "benchmarks/data/published_memory.json"]
GIB = 2**30
LEVEL_KEY = {"allocated": "allocatedBytes", "reserved": "reservedBytes", "device-used": "peakBytes",
             "unknown": "reservedBytes"}
PRECISIONS = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16", "bf16-pure": "bf16-pure"}
OPTIMIZERS = {"adamw": ("adamw", False), "adam": ("adam", False), "sgd": ("sgd", False),
              "adamw-8bit": ("adamw", True), "paged-adamw-8bit": ("adamw", True), "adam-8bit": ("adam", True)}
# What a row may state that `memfit estimate` has no flag for (the row's field -> the reason).
NOT_EXPRESSIBLE = {"compile": "torch.compile (not built: memfit has no compile option)"}
SPLITS = ("dev", "held_out", "all")


def load_table(path: Path = TABLE) -> dict[str, Any]:
    table: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return table


def unexpressible(row: Mapping[str, Any]) -> str | None:
    """Why `memfit estimate` cannot express the row as published, or None."""
    reasons = [why for field, why in NOT_EXPRESSIBLE.items() if row.get(field)]
    if row.get("optimizer", "adamw") not in OPTIMIZERS:
        reasons.append(f"optimizer {row['optimizer']!r}")
    if row.get("precision") not in PRECISIONS:
        reasons.append(f"precision {row.get('precision')!r}")
    if not row.get("hf_config"):
        reasons.append("no config.json for the model")
    reasons += [f"not modelled: {flag}" for flag in row.get("unmodelled", ())]
    return "; ".join(reasons) or None


def estimate_args(row: Mapping[str, Any], config_path: Path) -> list[str]:
    """The `memfit estimate` command line that pins the row's published configuration."""
    optimizer, eight_bit = OPTIMIZERS[row.get("optimizer", "adamw")]
    gpus = int(row.get("gpus", 1))
    args = ["estimate", "--hf-config", str(config_path), "--seq", str(row["seq_len"]),
            "--micro-batch", str(row["micro_batch"]), "--accumulation", str(row.get("grad_accum", 1)),
            "--world-size", str(gpus), "--gpus-per-node", str(min(gpus, int(row.get("gpus_per_node", 8)))),
            "--precision", PRECISIONS[row["precision"]],
            "--checkpointing", row.get("activation_checkpointing", "none"),
            "--engine", row.get("engine", "ddp"), "--optimizer", optimizer, "--json"]
    if row.get("engine", "ddp") != "ddp":
        args += ["--stage", str(row.get("zero_stage", 3))]
    if row.get("offload", "none") != "none":
        args += ["--offload", row["offload"]]
    if eight_bit:
        args.append("--optimizer8bit")
    if row.get("optimizer_in_backward"):
        args.append("--optimizer-in-backward")
    if row.get("chunked_loss"):
        args.append("--chunked-loss")
    if row.get("activation_offload"):
        args.append("--activation-offload")
    if row.get("task") in ("masked-lm", "sequence-classification", "causal-lm"):
        args += ["--task", row["task"]]
    if row.get("attention"):
        args += ["--attention", row["attention"]]
    peft = row.get("peft")
    if peft:
        args += ["--peft", peft["method"], "--lora-rank", str(peft.get("r", 16))]
        if peft.get("target_modules"):
            args += ["--lora-targets", ",".join(peft["target_modules"])]
    return args


def run_estimate(args: Sequence[str]) -> tuple[int, str, str]:
    """`memfit estimate` in this process: (exit status, stdout, stderr)."""
    from memfit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as usage:  # argparse refusing a flag or a value: the row names what it was
            status = usage.code if isinstance(usage.code, int) else 2
    return status, out.getvalue(), err.getvalue()


def predict_row(row: Mapping[str, Any], workdir: Path) -> dict[str, Any]:
    """memfit's prediction for one row at the level the source reports, or why there is none."""
    level = row.get("level", "unknown")
    out: dict[str, Any] = {"id": row["id"], "split": row.get("split", "dev"), "source": row["source"]["project"],
                           "level": level, "published_gib": row["published_gib"], "predicted_gib": None,
                           "error_percent": None, "reason": unexpressible(row),
                           "approximations": list(row.get("approximations", ()))}
    if out["reason"]:
        return out
    config = workdir / f"{row['id']}.json"
    config.write_text(json.dumps(row["hf_config"]), encoding="utf-8")
    command = estimate_args(row, config)
    status, stdout, stderr = run_estimate(command)
    out["command"] = "memfit " + " ".join(command).replace(str(config), f"{row['id']}.json")
    if status != 0:
        said = (stderr.strip() or stdout.strip()).replace(str(config), config.name)
        return {**out, "reason": f"memfit estimate exit {status}: {said}"}
    breakdown = json.loads(stdout)
    predicted = breakdown[LEVEL_KEY[level]] / GIB
    error = 100.0 * (predicted - row["published_gib"]) / row["published_gib"]
    return {**out, "predicted_gib": round(predicted, 2), "error_percent": round(error, 1),
            "levels_gib": {name: round(breakdown[key] / GIB, 2) for name, key in LEVEL_KEY.items()
                           if name != "unknown"}}


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    errors = [r["error_percent"] for r in results if r["error_percent"] is not None]
    return {
        "rows": len(results), "predicted": len(errors), "not_expressible": len(results) - len(errors),
        "mape_percent": round(statistics.fmean(abs(e) for e in errors), 1) if errors else None,
        "median_error_percent": round(statistics.median(errors), 1) if errors else None,
        "worst_under_percent": round(min(errors), 1) if errors else None,
        "worst_over_percent": round(max(errors), 1) if errors else None,
        "within_10_percent": sum(1 for e in errors if abs(e) <= 10.0),
    }


def run(table: Mapping[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="published-memory-") as tmp:
        results = [predict_row(row, Path(tmp)) for row in table["rows"]]
    known = [r for r in results if r["level"] != "unknown"]
    return {
        "benchmark": "published_memory",
        "description": table.get("description", ""),
        "split_rule": table.get("split_rule", ""),
        "in_sample": "every row: built by memfit's developers (issue #29 keeps its own held-out table)",
        "device": "none: memfit's memory model only; the published figures were measured on GPUs by their sources",
        "summary": {split: summarize([r for r in results if split == "all" or r["split"] == split])
                    for split in SPLITS},
        "summary_level_stated": summarize(known),
        "by_source": {source: summarize([r for r in results if r["source"] == source])
                      for source in sorted({r["source"] for r in results})},
        "rows": results,
        "provenance": stamp(MEASURES, command="python benchmarks/published_memory.py"),
    }


def print_table(report: Mapping[str, Any]) -> None:
    print(f"{'row':46} {'level':11} {'published':>9} {'memfit':>8} {'error':>7}")
    for r in report["rows"]:
        if r["error_percent"] is None:
            print(f"{r['id'][:46]:46} {r['level']:11} {r['published_gib']:9.1f} {'-':>8} {'-':>7}  {r['reason']}")
        else:
            print(f"{r['id'][:46]:46} {r['level']:11} {r['published_gib']:9.1f} {r['predicted_gib']:8.1f} "
                  f"{r['error_percent']:+6.1f}%" + ("  ~ approximated" if r["approximations"] else ""))
    print()
    print(f"{'split':22} {'rows':>4} {'predicted':>9} {'MAPE %':>7} {'median %':>8} {'worst under %':>13} {'<=10 %':>6}")
    named = [(s, report["summary"][s]) for s in SPLITS] + [("level stated", report["summary_level_stated"])]
    for name, s in named:
        print(f"{name:22} {s['rows']:4} {s['predicted']:9} {s['mape_percent'] if s['mape_percent'] is not None else '-':>7} "
              f"{s['median_error_percent'] if s['median_error_percent'] is not None else '-':>8} "
              f"{s['worst_under_percent'] if s['worst_under_percent'] is not None else '-':>13} {s['within_10_percent']:6}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--json", type=Path, default=RESULT, help=f"where the result goes (default {RESULT})")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    report = run(load_table(args.table))
    if not args.quiet:
        print_table(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Step-time benchmark: memfit's predicted training throughput against published measurements.

    PYTHONPATH=operator:benchmarks python benchmarks/step_time.py [--json OUT] [--quiet]

Each row of benchmarks/data/published_throughput.json (docs/step_time.md says how the rows were chosen,
cited and split into dev / held_out) is pinned as a user would pin it on a one-pool cluster: an inline
Hugging Face config, the published engine, sharding, precision, checkpointing, micro-batch and
accumulation, on a catalog pool of the published GPU (8 GPUs per node, the published network when the
source states it). The prediction is built the way the planner builds one (`resolve_shape`,
`search_context`, `resolve_offer(catalog_pool(...))`, `time_terms(...).step_seconds`), converted to
tokens/s per GPU and compared with the published figure. A row the model cannot express exactly (fp8,
torch.compile, LAMB) is still predicted; its `flags` say what the model does not see.

Summary per split (dev, held_out, all) and per GPU: median predicted/published, MAPE, counts, and the
A100:H100 speed ratio on rows published in matched pairs (same model, sequence, GPUs and micro-batch
on both GPUs, the `pair` field). The numbers are in-sample for whoever tuned the model on this table.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit.api.common import Checkpointing, Engine, Offload, PeftMethod, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec, OptimizerKind
from memfit.api.training_config import TrainingConfig
from memfit.catalog import CATALOG, GpuCatalog
from memfit.memory.strategy import Strategy
from memfit.planner import resolve_shape, search_context
from memfit.planner.offers import Offer, catalog_pool, resolve_offer
from memfit.timing.step import time_terms
from provenance import stamp

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "benchmarks" / "data" / "published_throughput.json"
RESULT = REPO / "benchmarks" / "results" / "step_time.json"
MEASURES = [
    "operator/memfit/timing",
    "operator/memfit/memory/strategy.py",
    "operator/memfit/memory/states.py",
    "operator/memfit/api/training_config.py",
    "operator/memfit/memory/shape.py",
    "operator/memfit/memory/problems.py",
    "operator/memfit/catalog.py",
    "operator/memfit/planner/offers.py",
    "operator/memfit/planner/measured_speed.py",
    "operator/memfit/planner/plan_job.py",
    "benchmarks/step_time.py",
    "benchmarks/data/published_throughput.json",
]
SPLITS = ("dev", "held_out", "all")
OPTIMIZERS = {"adamw": OptimizerKind.ADAMW, "adam": OptimizerKind.ADAM, "sgd": OptimizerKind.SGD}

# ------------------------------------------------------------------------------------------ table

def load_table(path: Path = TABLE) -> dict[str, Any]:
    """The published-throughput table: {"models": {name: model}, "rows": [row, ...]}."""
    table: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return table


def row_hf_config(row: Mapping[str, Any], models: Mapping[str, Any]) -> dict[str, Any]:
    """The inline Hugging Face config of a row's model (n_positions follows seq_len where the source's
    runs sized learned positions to the sequence, as llm-foundry's MPT benchmark did)."""
    model = models[row["model"]]
    config = dict(model["hf_config"])
    if model.get("positions_follow_seq_len"):
        config["n_positions"] = row["seq_len"]
    return config


def row_spec(row: Mapping[str, Any], models: Mapping[str, Any]) -> MemoryOptimizedTrainingJobSpec:
    """The job a user would submit to reproduce the row: its model inline, its batch, its strategy pinned."""
    global_batch = row["micro_batch"] * row["grad_accum"] * row["gpus"]
    return MemoryOptimizedTrainingJobSpec.model_validate({
        "problem": {"huggingface": {"model": f"public/{row['model']}", "config": row_hf_config(row, models),
                                    "sequenceLength": row["seq_len"]}},
        "training": {"globalBatchSize": global_batch, "maxSteps": 100,
                     "optimizer": OPTIMIZERS.get(row["optimizer"], OptimizerKind.ADAMW).value},
    })


def row_strategy(row: Mapping[str, Any]) -> Strategy:
    """The published configuration as memfit's Strategy (LAMB is modelled as AdamW: same state size)."""
    config = TrainingConfig.model_construct(
        engine=Engine(row["engine"]), zero_stage=int(row["zero_stage"]), precision=Precision(row["precision"]),
        activation_checkpointing=Checkpointing(row["activation_checkpointing"]), offload=Offload.NONE,
        optimizer8bit=False, micro_batch_size=row["micro_batch"], gradient_accumulation_steps=row["grad_accum"],
        peft=PeftMethod.NONE,
    )
    optimizer = OPTIMIZERS.get(row["optimizer"], OptimizerKind.ADAMW)
    return Strategy(config=config, optimizer=optimizer, world_size=row["gpus"],
                    gpus_per_node=min(row["gpus_per_node"], row["gpus"]))


def row_offer(row: Mapping[str, Any], catalog: GpuCatalog = CATALOG) -> tuple[Offer | None, str]:
    """The row's pool resolved as the planner resolves it, and where its GPU came from."""
    gpu, source, use = catalog.find(row["gpu"]), "catalog", catalog
    if gpu is None:
        return None, f"GPU {row['gpu']!r} is not in the catalog"
    pool = catalog_pool(gpu, gpus_per_node=max(row["gpus_per_node"], 1), max_nodes=max(1, -(-row["gpus"] // 8)))
    if row.get("inter_node_gbits"):
        interconnect = pool.spec.interconnect.model_copy(update={"inter_node_gbps": float(row["inter_node_gbits"])})
        pool = pool.model_copy(update={"spec": pool.spec.model_copy(update={"interconnect": interconnect})})
    resolved = resolve_offer(pool, catalog=use)
    if not isinstance(resolved, Offer):
        return None, str(resolved)
    return resolved, source


# Keyword arguments `time_terms` may grow (detected by name) -> the row flag each one carries.
FLAG_ARGUMENTS = {"compiled": "torch_compile", "fp8": "fp8_linear"}


def _optional_flags(function: Callable[..., Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments the model may have grown for what the row states (tf32, compile, fp8)."""
    accepted = inspect.signature(function).parameters
    wanted = {"tf32": bool(row.get("tf32"))}
    wanted.update({name: flag in row.get("flags", ()) for name, flag in FLAG_ARGUMENTS.items()})
    return {name: value for name, value in wanted.items() if name in accepted}


def _not_modelled(row: Mapping[str, Any], passed: Mapping[str, Any]) -> list[str]:
    """What the row states that the model was not told (its flags, and TF32 when it cannot take it)."""
    told = {FLAG_ARGUMENTS[name] for name in passed if name in FLAG_ARGUMENTS}
    out = [flag for flag in row.get("flags", ()) if flag not in told]
    if row.get("tf32") and "tf32" not in passed:
        out.append("tf32 (fp32 matmuls on tensor cores)")
    return out


# ------------------------------------------------------------------------------------------ prediction

def predict_row(row: Mapping[str, Any], models: Mapping[str, Any], catalog: GpuCatalog = CATALOG) -> dict[str, Any]:
    """memfit's predicted tokens/s per GPU for one row, or the reason it has none."""
    out: dict[str, Any] = {"id": row["id"], "split": row["split"], "gpu": row["gpu"], "family": row["family"],
                           "published_tokens_per_s_per_gpu": row["published"]["tokens_per_s_per_gpu"],
                           "predicted_tokens_per_s_per_gpu": None, "ratio": None, "reason": None}
    try:
        spec = row_spec(row, models)
        shape = resolve_shape(spec, None)
        if isinstance(shape, str):
            return {**out, "reason": f"shape: {shape}"}
        ctx = search_context(spec, shape)
        offer, source = row_offer(row, catalog)
        if offer is None:
            return {**out, "reason": source}
        strategy = row_strategy(row)
        per_gpu = row["micro_batch"] * row["grad_accum"]
        extra = _optional_flags(time_terms, row)
        terms = time_terms(ctx.shape, strategy, samples_per_gpu_step=per_gpu,
                           flops_per_sample_override=ctx.flops_per_sample, mfu=ctx.mfu, **extra)
        step = terms.step_seconds(offer.speed, row["micro_batch"])
    except Exception as error:
        return {**out, "reason": f"{type(error).__name__}: {error}"}
    seconds = step.step_seconds
    if not (seconds > 0 and math.isfinite(seconds)):
        return {**out, "reason": f"step_seconds is {seconds}"}
    predicted = per_gpu * row["seq_len"] / seconds
    published = row["published"]["tokens_per_s_per_gpu"]
    return {**out, "predicted_tokens_per_s_per_gpu": round(predicted, 1), "ratio": round(predicted / published, 4),
            "step_seconds": round(seconds, 5), "compute_seconds": round(step.compute_seconds, 5),
            "communication_seconds": round(step.communication_seconds, 5), "offer_source": source,
            "flags_passed": sorted(extra), "flags_not_modelled": _not_modelled(row, extra)}


# ------------------------------------------------------------------------------------------ summary

def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median predicted/published, MAPE (%) and counts of a set of row results."""
    ratios = [r["ratio"] for r in results if r["ratio"] is not None]
    return {
        "rows": len(results),
        "predicted": len(ratios),
        "not_predicted": len(results) - len(ratios),
        "median_ratio": round(statistics.median(ratios), 4) if ratios else None,
        "mape_percent": round(100 * statistics.fmean(abs(x - 1) for x in ratios), 2) if ratios else None,
        "within_2x": sum(1 for x in ratios if 0.5 <= x <= 2.0),
    }


def _in_split(result: Mapping[str, Any], split: str) -> bool:
    return split == "all" or result["split"] == split


def pair_ratios(rows: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]],
                fast: str = "h100-80", slow: str = "a100-80") -> dict[str, Any]:
    """H100:A100 throughput ratios, predicted and published, over rows published on both GPUs with the
    same `pair` key; `error` is predicted / published - 1 of the median ratios."""
    by_id = {r["id"]: r for r in results}
    groups: dict[str, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("pair") and row["gpu"] in (fast, slow):
            groups.setdefault(row["pair"], {})[row["gpu"]] = by_id[row["id"]]
    pairs = []
    for key, members in sorted(groups.items()):
        a, b = members.get(slow), members.get(fast)
        if a is None or b is None or a["predicted_tokens_per_s_per_gpu"] is None or b["predicted_tokens_per_s_per_gpu"] is None:
            continue
        pairs.append({"pair": key,
                      "published": round(b["published_tokens_per_s_per_gpu"] / a["published_tokens_per_s_per_gpu"], 3),
                      "predicted": round(b["predicted_tokens_per_s_per_gpu"] / a["predicted_tokens_per_s_per_gpu"], 3)})
    if not pairs:
        return {"pairs": [], "median_published": None, "median_predicted": None, "error": None}
    published = statistics.median(p["published"] for p in pairs)
    predicted = statistics.median(p["predicted"] for p in pairs)
    return {"pairs": pairs, "median_published": round(published, 3), "median_predicted": round(predicted, 3),
            "error": round(predicted / published - 1, 4)}


def summary(rows: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per split, and per GPU within each split, plus the matched A100:H100 ratio."""
    out: dict[str, Any] = {}
    for split in SPLITS:
        chosen = [r for r in results if _in_split(r, split)]
        gpus = sorted({r["gpu"] for r in chosen})
        out[split] = {**summarize(chosen),
                      "per_gpu": {g: summarize([r for r in chosen if r["gpu"] == g]) for g in gpus},
                      "per_family": {f: summarize([r for r in chosen if r["family"] == f])
                                     for f in sorted({r["family"] for r in chosen})}}
    out["h100_over_a100_80"] = pair_ratios(rows, results)
    return out


# ------------------------------------------------------------------------------------------ report

def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(results: Iterable[Mapping[str, Any]], report: Mapping[str, Any]) -> None:
    print(f"{'row':48} {'split':8} {'published':>10} {'predicted':>10} {'ratio':>6}")
    for r in results:
        print(f"{r['id']:48} {r['split']:8} {r['published_tokens_per_s_per_gpu']:>10.0f} "
              f"{_fmt(r['predicted_tokens_per_s_per_gpu'], '>10.0f')} {_fmt(r['ratio'], '>6.2f')}"
              + (f"  ({r['reason']})" if r["reason"] else ""))
    print()
    for split in SPLITS:
        s = report[split]
        print(f"{split:8} rows {s['rows']:>2}  predicted {s['predicted']:>2}  median {_fmt(s['median_ratio'], '.3f')}"
              f"  MAPE {_fmt(s['mape_percent'], '.1f')}%  within 2x {s['within_2x']}")
        for gpu, g in s["per_gpu"].items():
            print(f"    {gpu:10} n={g['predicted']:>2}  median {_fmt(g['median_ratio'], '.3f')}"
                  f"  MAPE {_fmt(g['mape_percent'], '.1f')}%")
    pairs = report["h100_over_a100_80"]
    print(f"H100/A100-80 on {len(pairs['pairs'])} matched pairs: published {pairs['median_published']}, "
          f"predicted {pairs['median_predicted']} (error {pairs['error']})")


def run(table: Mapping[str, Any], catalog: GpuCatalog = CATALOG) -> dict[str, Any]:
    """Predict every row and summarise."""
    results = [predict_row(row, table["models"], catalog) for row in table["rows"]]
    return {"rows": results, "summary": summary(table["rows"], results)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=RESULT, help="where to write the result")
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    args = parser.parse_args(argv)
    table = load_table()
    result = run(table)
    if not args.quiet:
        print_report(result["rows"], result["summary"])
    out = {"benchmark": "step_time", "table": str(TABLE.relative_to(REPO)), "split_rule": table["split_rule"],
           "in_sample_note": "published figures anyone may have tuned against; the issue's own held-out table is separate",
           "summary": result["summary"], "rows": result["rows"],
           "provenance": stamp(MEASURES, command="python benchmarks/step_time.py")}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

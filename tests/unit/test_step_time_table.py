"""The published-throughput table (benchmarks/data/published_throughput.json) and the step-time
benchmark that reads it (benchmarks/step_time.py): schema, one prediction per row, summary arithmetic."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from memfit.catalog import CATALOG

REPO = Path(__file__).resolve().parents[2]


def _step_time() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))  # step_time imports benchmarks/provenance.py
    spec = importlib.util.spec_from_file_location("benchmark_step_time", REPO / "benchmarks" / "step_time.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


step_time = _step_time()
TABLE = step_time.load_table()
ROWS = TABLE["rows"]
IDS = [row["id"] for row in ROWS]


def test_table_size_and_unique_ids() -> None:
    assert 25 <= len(ROWS) <= 45
    assert len(set(IDS)) == len(IDS)


def test_both_splits_and_several_gpus_are_covered() -> None:
    splits = {row["split"] for row in ROWS}
    assert splits == {"dev", "held_out"}
    assert {"a100-40", "a100-80", "h100-80", "v100-32"} <= {row["gpu"] for row in ROWS}
    assert {"bf16", "fp16", "fp32"} <= {row["precision"] for row in ROWS}


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_row_schema(row: dict[str, Any]) -> None:
    source = row["source"]
    assert source["url"].startswith(("https://github.com/", "https://arxiv.org/")), source["url"]
    assert source["project"] and source["where"]
    assert row["split"] in ("dev", "held_out")
    assert row["model"] in TABLE["models"]
    assert CATALOG.find(row["gpu"]) is not None
    assert row["precision"] in ("bf16", "fp16", "fp32")
    assert row["engine"] in ("ddp", "fsdp", "deepspeed")
    assert row["activation_checkpointing"] in ("none", "selective", "full")
    for key in ("seq_len", "micro_batch", "grad_accum", "gpus", "gpus_per_node"):
        assert isinstance(row[key], int) and row[key] >= 1, key
    published = row["published"]
    assert published["tokens_per_s_per_gpu"] > 0 and published["value"] > 0 and published["unit"]
    assert isinstance(row["flags"], list)


def test_split_rule_holds() -> None:
    """held_out is exactly the torchtitan rows and the V100 rows (docs/step_time.md)."""
    for row in ROWS:
        held = row["source"]["project"] == "pytorch/torchtitan" or row["gpu"].startswith("v100")
        assert (row["split"] == "held_out") == held, row["id"]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_every_row_is_predicted(row: dict[str, Any]) -> None:
    result = step_time.predict_row(row, TABLE["models"])
    assert result["reason"] is None, result["reason"]
    predicted = result["predicted_tokens_per_s_per_gpu"]
    assert predicted is not None and math.isfinite(predicted) and predicted > 0
    assert result["ratio"] == pytest.approx(predicted / row["published"]["tokens_per_s_per_gpu"], rel=1e-3)


def test_summary_math_on_a_hand_made_example() -> None:
    results = [
        {"id": "a", "split": "dev", "gpu": "a100-80", "family": "x", "ratio": 0.5,
         "predicted_tokens_per_s_per_gpu": 50.0, "published_tokens_per_s_per_gpu": 100.0},
        {"id": "b", "split": "dev", "gpu": "h100-80", "family": "x", "ratio": 1.5,
         "predicted_tokens_per_s_per_gpu": 300.0, "published_tokens_per_s_per_gpu": 200.0},
        {"id": "c", "split": "held_out", "gpu": "h100-80", "family": "y", "ratio": 1.0,
         "predicted_tokens_per_s_per_gpu": 10.0, "published_tokens_per_s_per_gpu": 10.0},
        {"id": "d", "split": "held_out", "gpu": "v100-32", "family": "y", "ratio": None,
         "predicted_tokens_per_s_per_gpu": None, "published_tokens_per_s_per_gpu": 5.0},
    ]
    rows = [{"id": "a", "gpu": "a100-80", "pair": "p"}, {"id": "b", "gpu": "h100-80", "pair": "p"},
            {"id": "c", "gpu": "h100-80", "pair": None}, {"id": "d", "gpu": "v100-32", "pair": None}]
    report = step_time.summary(rows, results)
    assert report["dev"]["median_ratio"] == 1.0
    assert report["dev"]["mape_percent"] == 50.0
    assert report["held_out"]["predicted"] == 1 and report["held_out"]["not_predicted"] == 1
    assert report["all"]["median_ratio"] == 1.0  # of 0.5, 1.0, 1.5
    assert report["all"]["mape_percent"] == pytest.approx(100 / 3, abs=0.01)
    assert report["all"]["per_gpu"]["h100-80"]["median_ratio"] == 1.25
    pairs = report["h100_over_a100_80"]
    assert pairs["median_published"] == 2.0 and pairs["median_predicted"] == 6.0 and pairs["error"] == 2.0

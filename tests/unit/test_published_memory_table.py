"""The published-memory table (benchmarks/data/published_memory.json) and the benchmark that reads it
(benchmarks/published_memory.py): schema, every row either predicted through `memfit estimate` or refused
with the estimate's own words, the level a source reports read from the matching breakdown field."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _published_memory() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmark imports benchmarks/provenance.py
    spec = importlib.util.spec_from_file_location("benchmark_published_memory",
                                                  REPO / "benchmarks" / "published_memory.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _published_memory()
ROWS = bench.load_table()["rows"]
IDS = [row["id"] for row in ROWS]


def test_unique_ids_and_both_splits() -> None:
    assert len(set(IDS)) == len(IDS)
    assert {row["split"] for row in ROWS} == {"dev", "held_out"}


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_row_schema(row: dict[str, Any]) -> None:
    source = row["source"]
    assert source["project"] and source["where"] and source["quote"], source
    assert source["url"].startswith("https://"), source["url"]
    assert row["level"] in bench.LEVEL_KEY
    assert row["published_gib"] > 0
    assert row["engine"] in ("ddp", "fsdp", "deepspeed")
    for key in ("micro_batch", "gpus"):
        assert isinstance(row[key], int) and row[key] >= 1, key


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_an_expressible_row_reaches_the_memory_model(row: dict[str, Any], tmp_path: Path) -> None:
    result = bench.predict_row(row, tmp_path)
    if bench.unexpressible(row) is not None:
        assert result["predicted_gib"] is None and result["reason"] == bench.unexpressible(row)
        return
    if result["predicted_gib"] is None:
        # Only the estimate's own refusals of the configuration or the architecture, never its flags.
        assert result["reason"].startswith("memfit estimate exit 2: error: "), result
        assert "strategy:" in result["reason"] or "not modelled analytically" in result["reason"], result
        return
    assert result["predicted_gib"] == result["levels_gib"][
        "reserved" if row["level"] == "unknown" else row["level"]]
    assert result["error_percent"] == pytest.approx(
        100 * (result["predicted_gib"] - row["published_gib"]) / row["published_gib"], abs=0.1)


def test_a_flag_memfit_does_not_have_is_not_swallowed(tmp_path: Path) -> None:
    row = next(r for r in ROWS if bench.unexpressible(r) is None and r["split"] == "held_out")
    result = bench.predict_row({**row, "activation_checkpointing": "every-other-layer"}, tmp_path)
    assert result["predicted_gib"] is None and "invalid choice" in result["reason"], result

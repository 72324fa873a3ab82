"""Plan summaries and one-line messages."""

from __future__ import annotations

from memfit.catalog import CATALOG
from memfit.planner import plan, plan_summary
from planner_factories import LLAMA_1B_CONFIG, make_job, make_pool


def test_plan_summary_carries_the_status_columns() -> None:
    result = plan(make_job().hf(LLAMA_1B_CONFIG).batch(64).baseline("a100-80").build(),
                  pools=[make_pool("l4", "l4"), make_pool("a100-80", "a100-80", per_node=8)], catalog=CATALOG)
    summary = plan_summary(result)
    assert summary is not None and result.chosen is not None
    assert summary.node_pool == result.chosen.pool
    assert summary.gpus == result.chosen.gpus
    assert summary.predicted_peak.endswith("Gi")
    assert summary.savings is not None and summary.savings.startswith("saves ")
    assert summary.baseline is not None and summary.baseline.startswith("plain bf16 DDP on 1x")
    assert summary.savings_percent is not None and summary.savings_percent >= 0
    assert summary.cost_per_hour_text.startswith("$")


def test_message_of_a_plan_and_of_no_fit() -> None:
    result = plan(make_job().build(), pools=[make_pool("l4", "l4")], catalog=CATALOG)
    assert result.message().startswith("Planned 1x NVIDIA-L4 (l4) ")
    assert " vs plain bf16 DDP on 1x1 NVIDIA-L4 (l4) " in result.message()
    assert result.message().endswith(": same cost")  # the plain setup is what memfit picked
    nofit = plan(make_job().pin(precision="bf16").build(), pools=[make_pool("t4", "t4")], catalog=CATALOG)
    assert nofit.message().startswith("NoFit: t4: ")
    assert plan_summary(nofit) is None

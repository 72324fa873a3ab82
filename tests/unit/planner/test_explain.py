"""Plan summaries and one-line messages."""

from __future__ import annotations

import pytest
from memfit.api.pool import GPUNodePool
from memfit.catalog import CATALOG
from memfit.planner import plan, plan_summary
from planner_factories import (
    LLAMA_1B_CONFIG,
    LLAMA_7B_CONFIG,
    LLAMA_70B_CONFIG,
    JobBuilder,
    make_job,
    make_pool,
)


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
    # The practitioner's plain DDP on the same L4, with the wall-clock ratio beside the savings.
    base, chosen = result.baseline, result.chosen
    assert base is not None and chosen is not None
    assert f" vs plain bf16 DDP on 1x1 NVIDIA-L4 (l4) ${base.total_cost:.2f}: " in result.message()
    assert f", {chosen.hours / base.hours:.2f}x the wall-clock" in result.message()
    nofit = plan(make_job().pin(precision="bf16").build(), pools=[make_pool("t4", "t4")], catalog=CATALOG)
    assert nofit.message().startswith("NoFit: t4: ")
    assert plan_summary(nofit) is None


T4 = make_pool("t4", "t4")
BF16_PINNED = ("Tesla-T4 has no bf16 (compute capability 8.0+ needed) and strategy.precision is pinned to bf16: "
               "pin fp16 or fp32, or leave precision auto")
NVME_PINNED = ("NVMe offload needs local NVMe; the pool has none (host.nvmeGiB) and strategy.offload is pinned to "
               "nvme: pin offload cpu or none, or leave it auto")
# A pool's reason names what the job pinned, or what the pool lacks for every allowed configuration;
# never a capability some allowed configuration does without (a T4 trains in fp16 when precision is
# auto, so its missing bf16 is no reason).
LACKS: dict[str, tuple[JobBuilder, list[GPUNodePool], str]] = {
    "bf16 pinned on a T4": (make_job().pin(precision="bf16"), [T4], BF16_PINNED),
    "QLoRA computing in bf16 on a T4": (
        make_job().hf(LLAMA_1B_CONFIG).peft("qlora", qlora={"computeDtype": "bf16"}), [T4],
        "Tesla-T4 has no bf16 (compute capability 8.0+ needed) and strategy.peft.qlora.computeDtype is pinned "
        "to bf16: set computeDtype fp16 or auto"),
    "nvme pinned on a pool without NVMe": (make_job().pin(offload="nvme"), [make_pool("t4", "t4", nvme_gib=0)],
                                          NVME_PINNED),
    "bf16 and nvme pinned on a T4 without NVMe": (
        make_job().pin(precision="bf16", offload="nvme"), [make_pool("t4", "t4", nvme_gib=0)],
        f"{BF16_PINNED}. {NVME_PINNED}"),
    "cpu offload pinned on a pool of unknown host memory": (
        make_job().pin(offload="cpu"), [make_pool("t4", "mystery-gpu", memory_mib=16384, price=1.0, bf16_tflops=50)],
        "CPU offload needs host.memoryGiB, which is unknown for this pool, and strategy.offload is pinned to cpu: "
        "give the pool's host.memoryGiB, or pin offload none or nvme, or leave it auto"),
    "activation offload pinned on a pool of unknown host memory": (
        make_job().pin(activationOffload="enabled"),
        [make_pool("t4", "mystery-gpu", memory_mib=16384, price=1.0, bf16_tflops=50)],
        "activation offload needs host.memoryGiB, which is unknown for this pool, and strategy.activationOffload is "
        "pinned to enabled: give the pool's host.memoryGiB, or set activationOffload auto or disabled"),
    "too big for a T4, precision auto": (
        make_job().hf(LLAMA_70B_CONFIG).max_nodes(1), [T4],
        "needs 25.3 GiB per GPU (23.0 GiB predicted + 10% headroom) at micro-batch 1 even with FSDP full shard, "
        "fp16, CPU offload, activation offload on 1 GPU; has 15.0 GiB"),
    "too big for a T4, fp16 pinned": (
        make_job().hf(LLAMA_70B_CONFIG).max_nodes(1).pin(precision="fp16"), [T4],
        "needs 25.3 GiB per GPU (23.0 GiB predicted + 10% headroom) at micro-batch 1 even with FSDP full shard, "
        "fp16, CPU offload, activation offload on 1 GPU; has 15.0 GiB"),
    "too big, offload auto on a pool without NVMe": (
        make_job().hf(LLAMA_7B_CONFIG).max_nodes(1), [make_pool("t4", "l4", nvme_gib=0, host_gib=16)],
        "without offload it needs 62.3 GiB per GPU (56.7 GiB predicted + 10% headroom) at micro-batch 8 even with "
        "DDP, bf16, full checkpointing, 8-bit optimizer, optimizer step in backward, chunked loss on 1 GPU; has "
        "22.5 GiB. FSDP full shard, bf16, CPU offload "
        "on 1 GPU would fit the GPU memory but needs 150.6 GiB host RAM per node; has 14.4 GiB usable"),
}


@pytest.mark.parametrize(("job", "pools", "reason"), LACKS.values(), ids=LACKS.keys())
def test_no_fit_reason_names_pins_and_lacks_for_every_allowed_choice(
    job: JobBuilder, pools: list[GPUNodePool], reason: str
) -> None:
    result = plan(job.build(), pools=pools, catalog=CATALOG)
    assert result.plan is None
    assert [(r.pool, r.reason) for r in result.rejections] == [("t4", reason)]
    assert result.message() == f"NoFit: t4: {reason}"


def test_pools_with_the_same_reason_share_one_clause() -> None:
    job = make_job().hf(LLAMA_70B_CONFIG).max_nodes(1).build()
    result = plan(job, pools=[make_pool("t4-spot", "t4"), make_pool("t4-ondemand", "t4"), make_pool("l4", "l4")],
                  catalog=CATALOG)
    reasons = {r.pool: r.reason for r in result.rejections}
    assert reasons["t4-spot"] == reasons["t4-ondemand"] != reasons["l4"]
    assert result.no_fit_reasons() == [f"l4: {reasons['l4']}", f"t4-ondemand, t4-spot: {reasons['t4-spot']}"]
    assert result.message().count(reasons["t4-spot"]) == 1
    assert result.no_fit_message() == "; ".join(result.no_fit_reasons())

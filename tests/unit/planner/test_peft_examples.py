"""Planner-suite expectations of the LoRA and QLoRA examples (examples/llama-8b-lora.yaml,
examples/llama-70b-qlora.yaml) on the example pools and on the built-in catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from memfit.api.common import Engine, PeftMethod
from memfit.api.training_config import TrainingConfig
from memfit.catalog import CATALOG
from memfit.cli.inputs import load_job, load_pools
from memfit.planner import catalog_pools, plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GIB = 1024**3


def _pools(source: str) -> list:
    if source == "catalog":
        return list(catalog_pools(CATALOG))
    pools, invalid = load_pools(EXAMPLES / "gpunodepools.yaml")
    assert not invalid
    return list(pools)


@pytest.mark.parametrize("source", ["example pools", "catalog"])
def test_llama_8b_lora_plans_lora_that_fits_with_headroom(source: str) -> None:
    job = load_job(EXAMPLES / "llama-8b-lora.yaml")
    result = plan(job.spec, pools=_pools(source), catalog=CATALOG)
    assert result.plan is not None and result.chosen is not None
    assert result.plan.peft == PeftMethod.LORA  # allowed, and cheaper than the best full fine-tune
    assert result.plan.memory.peak_bytes * (1 + result.plan.headroom_percent / 100) <= result.plan.gpu_memory_bytes
    assert result.plan.trainable_parameters == 41_943_040
    full = result.plan.full_finetune
    assert full is not None and full.estimated_cost is not None and full.estimated_cost > result.plan.estimated_cost
    for alternative in result.alternatives:
        assert alternative.strategy.config.peft in (PeftMethod.NONE, PeftMethod.LORA)  # never QLoRA


def _unsharded(config: TrainingConfig) -> bool:
    return config.engine == Engine.DDP or (config.engine == Engine.DEEPSPEED and config.zero_stage == 0)


@pytest.mark.parametrize("source", ["example pools", "catalog"])
def test_llama_70b_qlora_fits_one_80gb_gpu_and_explains_the_smaller_pools(source: str) -> None:
    job = load_job(EXAMPLES / "llama-70b-qlora.yaml")
    pools = _pools(source)
    result = plan(job.spec, pools=pools, catalog=CATALOG)
    assert result.plan is not None
    # Unsharded: every GPU holds the whole 4-bit model (more than one only where they cost no more).
    assert result.plan.peft == PeftMethod.QLORA and _unsharded(result.plan.training_config())
    assert result.plan.memory.peak_bytes * 1.1 <= result.plan.gpu_memory_bytes
    # The example pools' largest GPUs are 80 GB; the catalog also has the H200 (141 GB, cheaper per
    # hour than an H100), which wins there -- with the 80 GB GPUs as unsharded alternatives.
    single_80 = [c for c in (result.chosen, *result.alternatives) if c is not None
                 and _unsharded(c.strategy.config)
                 and 79 * GIB <= c.usable_bytes <= 81 * GIB and c.strategy.config.peft == PeftMethod.QLORA]
    assert single_80
    if source == "example pools":
        assert 79 * GIB <= result.plan.gpu_memory_bytes <= 81 * GIB
    rejected = {r.pool: r.reason for r in result.rejections}
    for name in ("l4", "l40s", "a10g") if source == "example pools" else ("l4", "l40s", "a100-40"):
        assert name in rejected and "needs" in rejected[name] and "QLoRA" in rejected[name], rejected.get(name)


def test_llama_70b_qlora_with_engine_auto_may_shard_the_4bit_base_with_fsdp() -> None:
    """Unpinned, the planner also searches QLoRA on FSDP (the 4-bit base sharded): it is chosen only
    when it costs less than the single-GPU plan, and every rank still holds under the GPU."""
    job = load_job(EXAMPLES / "llama-70b-qlora.yaml")
    single = plan(job.spec, pools=_pools("example pools"), catalog=CATALOG)
    spec = job.spec.model_copy(update={"strategy": job.spec.strategy.model_copy(update={"engine": Engine.AUTO})})
    free = plan(spec, pools=_pools("example pools"), catalog=CATALOG)
    assert single.plan is not None and free.plan is not None
    assert free.plan.peft == PeftMethod.QLORA
    assert free.plan.estimated_cost <= single.plan.estimated_cost
    assert free.plan.memory.peak_bytes * 1.1 <= free.plan.gpu_memory_bytes
    if free.plan.world_size > 1:
        assert free.plan.engine == Engine.FSDP
        assert free.plan.memory.parameters_bytes < single.plan.memory.parameters_bytes

"""optimizerImplementation in the planner: `auto` is fused wherever it can be chosen (a 32-bit torch or
DeepSpeed GPU step) because fused is never worse in memory or step time -- checked here on the models,
and against the exhaustive search (which tries every implementation) in test_search.py; a pin is kept;
8-bit, bf16-pure and offloaded optimizers, and a job's own script, keep the library's default."""

from __future__ import annotations

import pytest
from memfit.api.common import Checkpointing, OptimizerImplementation
from memfit.api.job import MemoryOptimizedTrainingJobSpec, StrategySpec
from memfit.catalog import CATALOG
from memfit.memory import predict_memory
from memfit.planner import plan
from memfit.planner.reference import best_objective
from memfit.planner.space import strategy_choices
from memfit.timing import GpuSpeed, estimate_step_seconds
from memfit_testbed.own_code_cases import LOOP, job_spec
from memory_factories import LLAMA2_7B, S, hf_shape
from planner_factories import make_job, make_pool

FUSED = OptimizerImplementation.FUSED
H100 = GpuSpeed(bf16_tflops=989, fp16_tflops=989, fp32_tflops=67, tf32_tflops=494, intra_node_gbps=450,
                inter_node_gbits=400, hbm_gbps=3350, sm_count=132, matmul_efficiency=0.8)


def test_auto_is_fused_where_the_step_is_torchs_and_unset_where_it_has_its_own_kernels() -> None:
    choices, _ = strategy_choices(StrategySpec())
    assert choices
    for c in choices:
        own = c.config.optimizer8bit or c.config.precision.value == "bf16-pure" or c.config.offload.value != "none"
        assert c.config.optimizer_implementation == (None if own else FUSED), c.describe()


def test_a_pin_is_kept_and_leaves_out_what_cannot_take_it() -> None:
    choices, _ = strategy_choices(StrategySpec(optimizer_implementation=OptimizerImplementation.FOREACH))
    assert choices and all(c.config.optimizer_implementation == OptimizerImplementation.FOREACH for c in choices)
    assert not any(c.config.optimizer8bit or c.config.offload.value != "none" for c in choices)


def test_a_jobs_own_script_keeps_its_librarys_default() -> None:
    choices, _ = strategy_choices(StrategySpec(), own_script=True)
    assert choices and all(c.config.optimizer_implementation is None for c in choices)
    # Nor is a script asked for memfit's per-op checkpointing policy.
    assert not any(c.config.activation_checkpointing == Checkpointing.SELECTIVE_OP for c in choices)
    assert any(c.config.activation_checkpointing == Checkpointing.SELECTIVE_OP
               for c in strategy_choices(StrategySpec())[0])
    spec = MemoryOptimizedTrainingJobSpec.model_validate(
        {**job_spec(LOOP), "training": {"globalBatchSize": 64, "maxSteps": 100}})
    chosen = plan(spec, pools=[make_pool("l4", "l4", per_node=4)], catalog=CATALOG).plan
    assert chosen is not None and chosen.optimizer_implementation is None


@pytest.mark.parametrize("builder", [S().ddp().bf16(), S().fsdp(3).bf16().world(8), S().deepspeed(2).bf16().world(8),
                                     S().ddp().fp32().ckpt("full").mbs(2)])
def test_fused_is_never_slower_nor_larger(builder: S) -> None:
    shape = hf_shape(LLAMA2_7B, seq=2048)
    runs = {name: builder.implementation(name).build() for name in ("fused", "foreach", "for-loop")}
    seconds = {name: estimate_step_seconds(shape, s, H100).step_seconds for name, s in runs.items()}
    peaks = {name: predict_memory(shape, s).peak_bytes for name, s in runs.items()}
    assert seconds["fused"] <= min(seconds["foreach"], seconds["for-loop"])
    assert peaks["fused"] <= min(peaks["foreach"], peaks["for-loop"])


def test_the_plan_runs_fused_and_a_pinned_loop_costs_at_least_as_much() -> None:
    pools = [make_pool("l4", "l4", per_node=4), make_pool("a100", "a100-80", per_node=8)]
    base = make_job().gpt(layers=12, hidden=768, heads=12, vocab=50257, sequenceLength=1024).batch(32)
    base = base.pin(optimizer8bit="disabled", offload="none")
    auto = plan(base.build(), pools=pools, catalog=CATALOG)
    assert auto.plan is not None
    # A 32-bit torch step (8-bit and offload pinned off, bf16-pure not allowed): auto must be fused.
    assert not auto.plan.optimizer8bit and auto.plan.offload.value == "none"
    assert auto.plan.precision.value != "bf16-pure"
    assert auto.plan.optimizer_implementation == FUSED
    loop = base.pin(optimizerImplementation="for-loop").build()
    pinned = plan(loop, pools=pools, catalog=CATALOG)
    assert pinned.chosen is not None and auto.chosen is not None
    assert pinned.chosen.total_cost >= auto.chosen.total_cost * (1 - 1e-9)
    assert pinned.plan is not None and pinned.plan.optimizer_implementation == OptimizerImplementation.FOR_LOOP
    expected = best_objective(loop, pools, catalog=CATALOG)
    assert expected == pytest.approx(pinned.chosen.total_cost, rel=1e-9)

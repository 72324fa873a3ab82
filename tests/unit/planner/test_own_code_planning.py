"""A job with its own container is planned as its script runs: DDP without memfit's DeepSpeed config,
DeepSpeed (stages and offload included) with it; the knobs it does not apply stay at the pins."""

from __future__ import annotations

from memfit.api.common import Checkpointing, Engine, Offload
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.catalog import CATALOG
from memfit.planner import plan
from memfit.planner.own_code import with_container_pins
from memfit_testbed.own_code_cases import LOOP, job_spec
from planner_factories import make_pool


def _plan(container: dict, **strategy: str) -> object:
    spec = MemoryOptimizedTrainingJobSpec.model_validate(
        {**job_spec(container, **strategy), "training": {"globalBatchSize": 64, "maxSteps": 100}})
    return plan(spec, pools=[make_pool("l4", "l4", per_node=4), make_pool("a100", "a100-80", per_node=8)],
                catalog=CATALOG)


def test_a_plain_loop_is_planned_on_ddp_with_its_pins() -> None:
    result = _plan(LOOP)
    chosen = result.plan
    assert chosen is not None and chosen.engine == Engine.DDP and chosen.offload == Offload.NONE
    assert chosen.activation_checkpointing == Checkpointing.NONE and not chosen.optimizer8bit
    assert all(c.strategy.config.engine == Engine.DDP for c in result.alternatives)


def test_a_script_taking_the_deepspeed_config_is_planned_on_deepspeed() -> None:
    chosen = _plan({**LOOP, "honors": ["deepspeedConfig"]}).plan
    assert chosen is not None and chosen.engine == Engine.DEEPSPEED


def test_memfits_own_trainer_keeps_the_whole_space() -> None:
    spec = MemoryOptimizedTrainingJobSpec.model_validate({"problem": job_spec(LOOP)["problem"]})
    assert with_container_pins(spec) is spec

"""spec.container: a job whose script applies the plan's knobs is accepted; each way its knobs and the
strategy pins disagree is refused naming the field (the CRD's CEL rules say the same:
tests/integration/test_own_code_admission.py)."""

from __future__ import annotations

import pytest
from memfit.api.common import Engine, Offload
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.own_code import Knob
from memfit.api.own_code_rules import (
    ACCUMULATION,
    ENGINE,
    IMAGE_WITH_CONTAINER,
    OWNED_ENV,
    PEFT,
    SHARDING,
    unpinned,
)
from memfit.api.rules import check_spec
from memfit_testbed.own_code_cases import LOOP, REFUSED, job_spec
from pydantic import ValidationError


def test_a_script_that_applies_the_plan_is_accepted() -> None:
    assert check_spec(job_spec(LOOP)) == []
    spec = MemoryOptimizedTrainingJobSpec.model_validate(job_spec(LOOP))
    assert spec.container is not None and spec.container.engine == Engine.DDP
    assert spec.container.offload == Offload.NONE


def test_a_deepspeed_config_carries_batch_and_precision_and_runs_deepspeed() -> None:
    container = {**LOOP, "honors": ["deepspeedConfig"]}
    spec = MemoryOptimizedTrainingJobSpec.model_validate(job_spec(container))
    assert spec.container is not None
    assert all(spec.container.applies(k) for k in (Knob.MICRO_BATCH_SIZE, Knob.GRADIENT_ACCUMULATION, Knob.PRECISION))
    assert not spec.container.applies(Knob.ACTIVATION_CHECKPOINTING)
    assert spec.container.engine == Engine.DEEPSPEED and spec.container.offload is None


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_job_memfit_could_not_plan_as_its_script_runs_is_refused_naming_the_field(case: str) -> None:
    spec, path, message = REFUSED[case]
    findings = check_spec(spec)
    assert [p for p, _ in findings] == [path], findings
    assert findings[0][1].startswith(message)
    with pytest.raises(ValidationError, match=path.replace(".", r"\.").replace("[", r"\[")):
        MemoryOptimizedTrainingJobSpec.model_validate(spec)


def test_every_message_has_a_case() -> None:
    messages = {m for _, _, m in REFUSED.values()}
    wanted = {IMAGE_WITH_CONTAINER, ACCUMULATION, ENGINE, SHARDING, PEFT, OWNED_ENV,
              *(unpinned(k) for k in (Knob.MICRO_BATCH_SIZE, Knob.PRECISION, Knob.ACTIVATION_CHECKPOINTING,
                                      Knob.OPTIMIZER_8BIT))}
    assert wanted <= messages, wanted - messages

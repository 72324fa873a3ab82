"""Hypothesis-generated hostile specs applied to the real API server: each rejected naming the field,
or admitted and marked InvalidSpec by the running operator naming the field, with no children; the
operator never crashes. The benchmark runs 500 or more (benchmarks/reliability.py)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfit_testbed.reliability.chaos import (
    ChaosCluster,
    OperatorProcess,
    new_namespace,
    operator_for,
    stop_checked,
)
from memfit_testbed.reliability.fuzz import judge
from memfit_testbed.reliability.hostile_specs import Case, hostile_case

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
EXAMPLES = 60
NAMES = count()


@pytest.fixture(scope="module")
def fuzz_target(
    chaos_cluster: ChaosCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ChaosCluster, str, OperatorProcess]]:
    namespace = new_namespace(chaos_cluster, "fuzz")
    op = operator_for(chaos_cluster, namespace, tmp_path_factory.mktemp("fuzz") / "operator.log")
    yield chaos_cluster, namespace, op
    stop_checked(op)


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_spec_is_refused_naming_the_field(
    fuzz_target: tuple[ChaosCluster, str, OperatorProcess], data: st.DataObject
) -> None:
    cc, namespace, op = fuzz_target
    case: Case = data.draw(hostile_case(f"fz-{next(NAMES):05d}"))
    verdict = judge(cc.kube, namespace, case, wait_seconds=20)
    assert op.alive(), op.log_tail()
    assert verdict.ok, (case.describe(), verdict.api_status, verdict.admitted_outcome, verdict.message)
    if not verdict.rejected:  # what reached the operator was refused before any child
        assert verdict.operator_invalid and not verdict.operator_children, case.describe()

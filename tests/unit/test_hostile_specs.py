"""The fuzz's conflicting-pins cases (hack/memfit_testbed/reliability/hostile_specs.py): each is refused by
the operator in process, naming its field, before any child (tests/reliability runs them against the API
server, whose CEL rules refuse them first)."""

from __future__ import annotations

import pytest
from memfit_testbed.reliability.fuzz import judge_in_process
from memfit_testbed.reliability.hostile_specs import CONFLICTS, conflict_case


@pytest.mark.parametrize("key", sorted(CONFLICTS))
def test_conflict_is_invalid_spec_naming_the_field(key: str) -> None:
    assert judge_in_process(conflict_case("fz-unit", key), "fuzz") == (True, "")

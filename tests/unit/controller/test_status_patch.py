"""The status merge patch deletes what the new status no longer has (and nothing that is not ours)."""

from __future__ import annotations

from memfit.controller.reconcile import with_deletions


def test_a_field_gone_from_the_new_status_is_sent_as_null() -> None:
    stored = {"phase": "Running", "progress": {"step": 40, "loss": 2.1, "resumedFromStep": 30, "eta": "1m"},
              "checkpointClaim": "j-checkpoints"}  # fmt: skip
    new = {"phase": "Running", "progress": {"step": 0, "eta": "2m"}}  # a replacement pod before its first step
    assert with_deletions(stored, new) == {
        "phase": "Running",
        "progress": {"step": 0, "eta": "2m", "loss": None, "resumedFromStep": None},
        "checkpointClaim": None,
    }


def test_keys_outside_the_status_model_are_left_alone() -> None:
    stored = {"phase": "Running", "kopf": {"progress": {}}}
    assert with_deletions(stored, {"phase": "Succeeded"}) == {"phase": "Succeeded"}


def test_lists_are_replaced_whole() -> None:
    stored = {"attempts": [{"index": 0, "reason": "x"}]}
    new = {"attempts": [{"index": 0}]}
    assert with_deletions(stored, new) == new

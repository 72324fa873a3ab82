"""planner.memo: identical inputs answered once; a new snapshot or another value computes again."""

from __future__ import annotations

from memfit.planner.memo import PlanMemo


def test_the_same_values_and_the_same_shared_objects_hit() -> None:
    memo: PlanMemo[int] = PlanMemo()
    pools, capacity = ["a100"], {"a100": 4}
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert memo.get(("spec", 1), (pools, capacity), compute) == 1
    assert memo.get(("spec", 1), (pools, capacity), compute) == 1
    assert (memo.hits, memo.misses) == (1, 1)
    assert memo.get(("spec", 2), (pools, capacity), compute) == 2  # another value
    assert memo.get(("spec", 1), (pools, {"a100": 4}), compute) == 3  # an equal but new capacity snapshot


def test_the_least_recently_used_entry_goes_first() -> None:
    memo: PlanMemo[str] = PlanMemo(size=2)
    shared = (object(),)
    memo.get("a", shared, lambda: "a")
    memo.get("b", shared, lambda: "b")
    memo.get("a", shared, lambda: "a again")  # a is now the most recent
    memo.get("c", shared, lambda: "c")  # b goes
    assert memo.get("a", shared, lambda: "miss") == "a"
    assert memo.get("b", shared, lambda: "b recomputed") == "b recomputed"


def test_an_entry_keeps_its_shared_objects_so_their_ids_cannot_be_reused() -> None:
    memo: PlanMemo[str] = PlanMemo()
    memo.get("k", ({"snapshot": 1},), lambda: "first")
    # The first snapshot is held by the entry: a new object never gets its id, so it never hits.
    assert memo.get("k", ({"snapshot": 1},), lambda: "second") == "second"

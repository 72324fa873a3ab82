"""`memfit-trainer probe` over scripts that misbehave: each finding names what was seen, and the ladder
stops where it must (memfit_trainer.probe.driver, findings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from probe_support import PROBE_LOOP, point, probe_cli
from trainer_support import PYTHON


def probe_mode(
    tmp: Path, mode: str, *, micro_batches: str = "2", timeout_s: float = 60
) -> tuple[int, dict[str, Any], str]:
    return probe_cli(tmp, [PYTHON, str(PROBE_LOOP), "--mode", mode], micro_batches=micro_batches,
                     timeout_s=timeout_s)  # fmt: skip


def test_a_script_that_ignores_the_micro_batch(tmp_path: Path) -> None:
    rc, summary, stderr = probe_mode(tmp_path, "ignores", micro_batches="2,4")
    assert rc != 0
    assert summary["findings"] == [
        "the script ran micro-batch 8 where memfit planned 2: it does not honor microBatchSize"
    ]
    assert [p["microBatch"] for p in summary["points"]] == [2]  # the ladder stops: 4 would say the same
    assert point(summary, 2)["outcome"] == "ignores-micro-batch"
    assert "does not honor microBatchSize" in stderr


def test_a_script_that_never_steps_an_optimizer(tmp_path: Path) -> None:
    rc, summary, _ = probe_mode(tmp_path, "never-steps")
    assert rc != 0
    assert point(summary, 2)["outcome"] == "never-stepped"
    assert summary["findings"] == ["the script never called an optimizer step: it exited with code 0 after 4 "
                                   "model calls and no torch.optim or DeepSpeed step"]  # fmt: skip


def test_a_script_that_exits_early(tmp_path: Path) -> None:
    rc, summary, stderr = probe_mode(tmp_path, "exits")
    # The run's whole stderr is passed on (the probe container's log), after its micro-batch.
    assert "memfit probe: micro-batch 2: the run's stderr:\n" in stderr and "giving up after step 1" in stderr
    assert rc != 0
    (finding,) = summary["findings"]
    assert finding.startswith(
        "the script exited early with code 1 after 1 of 3 optimizer steps at micro-batch 2"
    )
    assert "probe_loop: giving up after step 1 on purpose" in finding  # the last lines of its stderr
    assert point(summary, 2)["stepsSeen"] == 1


def test_a_script_that_hangs_is_killed_at_the_timeout(tmp_path: Path) -> None:
    rc, summary, _ = probe_mode(tmp_path, "hangs", timeout_s=15)
    assert rc != 0
    assert summary["findings"] == [
        "the script hung: killed after 15s at micro-batch 2 with 1 of 3 optimizer steps seen"
    ]
    assert point(summary, 2)["outcome"] == "hung"


def test_the_ladder_stops_at_the_first_out_of_memory_run(tmp_path: Path) -> None:
    rc, summary, stderr = probe_mode(tmp_path, "oom", micro_batches="1,2,4,8")
    assert rc == 0, stderr  # measured points below the out-of-memory one
    assert summary["measuredMicroBatches"] == [1, 2] and summary["outOfMemoryMicroBatch"] == 4
    assert [p["microBatch"] for p in summary["points"]] == [1, 2, 4]
    assert point(summary, 4)["outcome"] == "out-of-memory"
    assert (
        point(summary, 4)["finding"]
        == "micro-batch 4 ran out of memory (CUDAOutOfMemory) after 0 optimizer steps"
    )
    assert summary["findings"] == []


def test_out_of_memory_at_the_smallest_micro_batch_fails(tmp_path: Path) -> None:
    rc, _, stderr = probe_mode(tmp_path, "oom", micro_batches="4")
    assert rc != 0
    assert "micro-batch 4 ran out of memory" in stderr


def test_the_cli_refuses_a_micro_batch_below_one(tmp_path: Path) -> None:
    from memfit_trainer.cli import main

    with pytest.raises(SystemExit):
        main(["probe", "--micro-batches", "0,2", "--out", str(tmp_path / "p.json"), "--", "true"])


def test_the_cli_needs_a_command(tmp_path: Path) -> None:
    from memfit_trainer.cli import main

    assert main(["probe", "--micro-batches", "2", "--out", str(tmp_path / "p.json")]) == 2


def _facts(
    exit_code: int | None, steps: list[int | None], *, stderr: str = "", ended: int | None = None
) -> Any:
    from memfit_trainer.probe.findings import RunFacts
    from memfit_trainer.probe.records import ProbeResult, StepRecord

    records = tuple(
        StepRecord(step=i + 1, peak_bytes=100, step_seconds=0.1, micro_batch=m) for i, m in enumerate(steps)
    )
    result = ProbeResult(rank=0, device="cpu", memory_meter="m", steps_wanted=3, ended="exit", forward_calls=3,
                         steps=records, steps_ended=len(steps) if ended is None else ended)  # fmt: skip
    return RunFacts(micro_batch=2, steps_wanted=3, exit_code=exit_code, timeout_seconds=30, stderr_tail=stderr,
                    result=result)  # fmt: skip


JUDGED = {
    "three steps at the planned micro-batch": (lambda: _facts(0, [2, 2, 2]), "measured"),
    "a model the probe cannot see the batch of still measures": (
        lambda: _facts(0, [None, None, None]),
        "measured",
    ),
    "memfit's trainer exit code for an OOM": (lambda: _facts(87, [2]), "out-of-memory"),
    "PyTorch's words on stderr": (
        lambda: _facts(1, [], stderr="torch.OutOfMemoryError: CUDA out of memory."),
        "out-of-memory",
    ),
    "another micro-batch at the second step": (lambda: _facts(0, [2, 6, 2]), "ignores-micro-batch"),
    "a hung run's ended step without its reading": (lambda: _facts(None, [], ended=1), "hung"),
    "a host crash is not an OOM": (lambda: _facts(-9, [2]), "exited-early"),
}


@pytest.mark.parametrize("case", JUDGED.values(), ids=JUDGED.keys())
def test_judge(case: tuple[Any, str]) -> None:
    from memfit_trainer.probe.findings import judge, steps_seen

    make, outcome = case
    facts = make()
    assert judge(facts).outcome.value == outcome
    if facts.exit_code == -9:
        assert (
            "code -9 (SIGKILL: the kernel's OOM killer, if host memory ran out) after 1 of 3"
            in judge(facts).finding
        )
    if outcome == "hung":
        assert steps_seen(facts) == 1 and "with 1 of 3 optimizer steps seen" in judge(facts).finding


def test_the_summary_takes_the_largest_peak_over_ranks_and_keeps_the_first_step_apart() -> None:
    from memfit_trainer.probe.findings import Outcome, Verdict
    from memfit_trainer.probe.records import ProbeResult, StepRecord
    from memfit_trainer.probe.summary import summarize

    def rank(index: int, peaks: list[int]) -> ProbeResult:
        steps = tuple(StepRecord(step=i + 1, peak_bytes=p, step_seconds=0.5 + index, micro_batch=2)
                      for i, p in enumerate(peaks))  # fmt: skip
        return ProbeResult(rank=index, device="cpu", memory_meter="m", steps_wanted=4, ended="steps",
                           forward_calls=4, steps=steps, steps_ended=4)  # fmt: skip

    point = summarize(
        2, Verdict(Outcome.MEASURED, ""), [rank(0, [50, 10, 30, 20]), rank(1, [40, 15, 25, 90])]
    )
    assert point.first_step_peak_bytes == 50
    assert point.peak_bytes == 30  # median of max(10, 15), max(30, 25), max(20, 90)
    assert point.step_seconds == 1.5 and point.steps_seen == 4

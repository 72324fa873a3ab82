"""The operator's progress reader against the trainer's real exporter: rank 0's series over HTTP, another
job's exporter on the same address ignored, an unreachable one None."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from memfit.controller.trainer_metrics import parse_trainer_metrics, read_trainer_metrics
from memfit.lifecycle.progress import progress_of, trainer_sample
from memfit_trainer.meters.readings import MemorySample
from memfit_trainer.metrics import TrainerMetrics

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def exporter() -> Iterator[tuple[TrainerMetrics, int]]:
    metrics = TrainerMetrics(job="llama-ft", rank=0)
    port = _free_port()
    assert metrics.serve(port)
    yield metrics, port
    metrics.close()


def _step(metrics: TrainerMetrics, step: int, loss: float) -> None:
    memory = MemorySample(allocated_bytes=1, reserved_bytes=2, peak_bytes=3, step_start_bytes=1)
    metrics.observe_step(step=step, seconds=0.5, samples=8, tokens=8 * 512, loss=loss, memory=memory, run_peak_bytes=3)


def test_progress_read_from_a_running_exporter(exporter: tuple[TrainerMetrics, int]) -> None:
    metrics, port = exporter
    url = f"http://127.0.0.1:{port}/metrics"
    before = read_trainer_metrics(url, job="llama-ft")
    assert before is not None and before["memfit_trainer_step"] == 0
    assert before["memfit_trainer_resumed_from_step"] == -1
    sample = trainer_sample(before, attempt=0)
    assert sample is not None and sample.loss is None and sample.resumed_from_step is None
    metrics.set_resumed_from(40)
    resumed = read_trainer_metrics(url, job="llama-ft")
    assert resumed is not None and resumed["memfit_trainer_step"] == 40  # at the checkpoint before a step
    for step in (41, 42, 43):
        _step(metrics, step, loss=3.0 - step / 100)
    metrics.observe_eval(loss=2.9)
    values = read_trainer_metrics(url, job="llama-ft")
    assert values is not None
    sample = trainer_sample(values, attempt=2)
    assert sample is not None
    assert (sample.step, sample.loss, sample.eval_loss, sample.resumed_from_step) == (43, 2.57, 2.9, 40)
    progress = progress_of(sample, max_steps=100, data_parallel=2, now=NOW)
    assert progress.tokens_per_second == 2 * 8 * 512 / 0.5
    assert (progress.step_seconds, progress.eta_seconds, progress.eta) == (0.5, 28, "28s")  # 57 steps x 0.5 s
    # The test bed shares 127.0.0.1: an exporter of another job is not this job's progress.
    assert read_trainer_metrics(url, job="other-job") is None


def test_unreachable_or_foreign_endpoints_are_none() -> None:
    assert read_trainer_metrics(f"http://127.0.0.1:{_free_port()}/metrics", job="j") is None
    assert parse_trainer_metrics("# nothing here\n", job="j") is None
    text = 'memfit_trainer_step{job="j",rank="1"} 5\n'  # rank 1 only: not rank 0
    assert parse_trainer_metrics(text, job="j") is None


def test_a_taken_port_is_retried_until_it_frees() -> None:
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = int(holder.getsockname()[1])
    metrics = TrainerMetrics(job="late", rank=0)
    try:
        assert not metrics.serve(port)  # taken: the exporter keeps trying in the background
        url = f"http://127.0.0.1:{port}/metrics"
        holder.close()
        deadline = time.monotonic() + 15
        values = None
        while values is None and time.monotonic() < deadline:
            time.sleep(0.5)
            values = read_trainer_metrics(url, job="late")
        assert values is not None and values["memfit_trainer_step"] == 0
    finally:
        holder.close()
        metrics.close()

"""The training loop: accumulation to the global batch, engines agreeing, checkpointing's effect, metrics."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from memfit_trainer.dist import free_port
from trainer_support import PlanBuilder, cpu_cannot_run, make_plan

STEPS = 3


def test_engines_and_accumulation_splits_give_the_same_losses(train_local: Callable[..., Any]) -> None:
    """fp32, same data per step: DDP, FSDP2 and DeepSpeed ZeRO-0..3, any micro-batch x accumulation split,
    follow one loss trajectory (the global batch is what the optimizer sees)."""
    plans = {
        "ddp 4x1": make_plan().ddp().batch(4, 1),
        "ddp 1x4": make_plan().ddp().batch(1, 4),
        "fsdp2 2x2": make_plan().fsdp(2).batch(2, 2),
        "fsdp3 offload 1x4": make_plan().fsdp(3).offload("cpu").batch(1, 4),
        "zero0 2x2": make_plan().deepspeed(0).batch(2, 2),
        "zero2 4x1": make_plan().deepspeed(2).batch(4, 1),
        "zero3 1x4": make_plan().deepspeed(3).batch(1, 4),
    }
    trajectories = {
        name: [loss for _, loss in train_local(plan.optimizer("sgd").learning_rate(0.1).steps(STEPS)).losses]
        for name, plan in plans.items()
    }
    reference = trajectories["ddp 4x1"]
    assert reference[-1] < reference[0]
    for name, trajectory in trajectories.items():
        assert trajectory == pytest.approx(reference, rel=1e-5), name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_sixteen_bit_engines_agree(precision: str, train_local: Callable[..., Any]) -> None:
    """bf16/fp16 with loss scaling: every engine makes the same SGD updates (SGD, unlike Adam, exposes a
    wrongly scaled gradient). Guards the DeepSpeed ZeRO-0 fp16 workaround (DeepSpeed PR #8393)."""
    if reason := cpu_cannot_run(make_plan().deepspeed(0).precision(precision)):
        pytest.skip(reason)
    plans = {
        "ddp": make_plan().ddp(),
        "fsdp3": make_plan().fsdp(3),
        "zero0": make_plan().deepspeed(0),
        "zero2": make_plan().deepspeed(2),
        "zero3": make_plan().deepspeed(3),
    }
    trajectories = {
        name: [loss for _, loss in train_local(plan.precision(precision).optimizer("sgd").learning_rate(0.1)
                                               .steps(STEPS)).losses]
        for name, plan in plans.items()
    }  # fmt: skip
    reference = trajectories["ddp"]
    assert reference[-1] < reference[0]
    for name, trajectory in trajectories.items():
        assert trajectory == pytest.approx(reference, rel=2e-3), name


LONG_SEQUENCE = {
    "builtin": {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "sequenceLength": 256}
}


@pytest.mark.parametrize(
    "plan",
    [make_plan().ddp(), make_plan().fsdp(3), make_plan().deepspeed(2), make_plan().deepspeed(3).bf16()],
    ids=["ddp", "fsdp3", "zero2", "zero3-bf16"],
)
def test_checkpointing_lowers_the_measured_activation_peak(
    plan: PlanBuilder, train_local: Callable[..., Any]
) -> None:
    """Peak above the step's starting bytes (activations + gradients + temporaries), CPU allocator truth."""
    transient = {}
    for mode in ("none", "selective", "full"):
        result = train_local(plan.problem(LONG_SEQUENCE).batch(4, 1).ckpt(mode).steps(2))
        transient[mode] = result.step_memory[-1]["transient_peak_bytes"]
    assert transient["full"] < transient["selective"] < transient["none"], transient
    # Two blocks of a 256-token, 64-wide GPT: full recomputation saves at least a quarter here.
    assert transient["full"] < 0.75 * transient["none"], transient


def test_metrics_exporter_serves_per_rank_series(train_local: Callable[..., Any], world1: Any) -> None:
    import torch
    from memfit_trainer.metrics import TrainerMetrics
    from memfit_trainer.train import TrainOptions, run_training
    from prometheus_client.parser import text_string_to_metric_families

    plan = make_plan().deepspeed(2).bf16().ckpt("full").eight_bit().batch(2, 3).steps(STEPS)
    metrics = TrainerMetrics(job="demo", rank=0)
    port = free_port()
    assert metrics.serve(port)
    try:
        run_training(
            plan.build(), env=world1, device=torch.device("cpu"), options=TrainOptions(), metrics=metrics
        )
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        metrics.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
               for s in f.samples}  # fmt: skip
    rank = (("job", "demo"), ("rank", "0"))

    def value(name: str) -> float:
        return samples[(name, rank)]

    assert value("memfit_trainer_step") == STEPS
    assert value("memfit_trainer_samples_total") == STEPS * 2 * 3
    assert value("memfit_trainer_step_seconds_count") == STEPS
    assert value("memfit_trainer_allocated_bytes") > 0
    assert value("memfit_trainer_peak_bytes") >= value("memfit_trainer_step_peak_bytes") > 0
    assert value("memfit_trainer_reserved_bytes") > 0
    assert value("memfit_trainer_device_memory_bytes") > 0
    assert value("memfit_trainer_tokens_per_second") > 0
    assert 0 < value("memfit_trainer_loss") < 10
    info = [
        dict(labels) for (name, labels), v in samples.items() if name == "memfit_trainer_plan_info" and v == 1
    ]
    assert info == [
        {
            "job": "demo", "rank": "0", "engine": "deepspeed", "stage": "2", "precision": "bf16",
            "checkpointing": "full", "offload": "none", "optimizer": "adamw-8bit", "micro_batch": "2",
            "accumulation": "3", "world_size": "1", "attempt": "0",
        }
    ]  # fmt: skip
    for (name, labels), _ in samples.items():
        if name.startswith("memfit_trainer_") and name != "memfit_trainer_plan_info":
            assert {k for k, _ in labels} <= {"job", "rank", "le"}, (name, labels)

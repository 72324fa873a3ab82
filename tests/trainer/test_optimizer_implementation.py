"""plan.optimizerImplementation in the trainer: torch's optimizers and DeepSpeed's get the switch, train
the same (fused, foreach and the per-tensor loop agree to rounding), and the step's temporaries are what
memfit.memory.temporaries.adam_scratch says, measured with the CPU allocator meter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from trainer_support import make_plan

IMPLEMENTATIONS = ("fused", "foreach", "for-loop")


def _optimizer(name: str, params: list[Any], kind: str = "adamw") -> Any:
    from memfit.api.common import OptimizerImplementation
    from memfit_trainer.optim import torch_optimizer

    training = make_plan().optimizer(kind).build().training
    return torch_optimizer(params, training, OptimizerImplementation(name))


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_torch_optimizers_get_the_switch(name: str) -> None:
    import torch

    for kind in ("adamw", "adam", "sgd"):
        opt = _optimizer(name, [torch.nn.Parameter(torch.zeros(4))], kind)
        assert opt.defaults["fused"] is (True if name == "fused" else None), kind
        assert opt.defaults["foreach"] is {"fused": None, "foreach": True, "for-loop": False}[name], kind


def test_every_implementation_takes_the_same_step() -> None:
    import torch

    torch.manual_seed(0)
    start, grads = torch.randn(64, 32), torch.randn(64, 32)
    results = []
    for name in IMPLEMENTATIONS:
        p = torch.nn.Parameter(start.clone())
        opt = _optimizer(name, [p])
        for _ in range(3):
            p.grad = grads.clone()
            opt.step()
        results.append(p.detach())
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_the_step_temporaries_are_what_the_memory_model_says(name: str) -> None:
    """A gated MLP's three adjacent matrices (no bias between them) after smaller tensors: fused needs nothing,
    foreach 4 B x every element, the loop the previous quotient beside the current square root and quotient."""
    import torch
    from memfit.api.common import OptimizerImplementation
    from memfit.api.training_config import PLAIN_FP32_DDP
    from memfit.memory.strategy import Device, Strategy
    from memfit.memory.temporaries import adam_scratch
    from memfit_trainer.meters import CpuAllocatorMeter

    h, f = 128, 512
    shapes = [(h,), (h, h), (h, h), (f, h), (f, h), (h, f)]  # norm, q, o, gate, up, down
    params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = _optimizer(name, params)
    opt.step()  # the states exist from here on
    with CpuAllocatorMeter() as meter, meter.region("step"):
        opt.step()
    measured = meter.results()["step"].peak_allocated_bytes
    config = PLAIN_FP32_DDP.model_copy(update={"optimizer_implementation": OptimizerImplementation(name)})
    elements = sum(p.numel() for p in params)
    predicted = adam_scratch(Strategy(config=config, device=Device.CPU), elements=elements, largest=h * f,
                             adjacent=3 * h * f)
    assert measured == pytest.approx(predicted, abs=64), (measured, predicted)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_deepspeed_passes_it_to_torchs_adamw_on_a_cpu(name: str, world1: Any) -> None:
    import deepspeed
    import torch
    from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config

    plan = make_plan().deepspeed(2).implementation(name).batch(1, 1).build()
    config = build_deepspeed_config(plan, cuda=False)
    model = torch.nn.Linear(8, 8)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    inner = getattr(optimizer, "optimizer", optimizer)
    assert isinstance(inner, torch.optim.AdamW)
    assert inner.defaults["fused"] is (True if name == "fused" else None)
    assert inner.defaults["foreach"] is {"fused": None, "foreach": True, "for-loop": False}[name]
    loss = engine(torch.randn(1, 8)).sum()
    engine.backward(loss)
    engine.step()


def test_deepspeed_on_a_gpu_keeps_fusedadam_for_fused_and_unset() -> None:
    from memfit_trainer.strategies.deepspeed_config import build_deepspeed_config

    for plan in (make_plan().deepspeed(2), make_plan().deepspeed(2).implementation("fused")):
        params = build_deepspeed_config(plan.build(), cuda=True)["optimizer"]["params"]
        assert "torch_adam" not in params and "fused" not in params
    params = build_deepspeed_config(make_plan().deepspeed(2).implementation("foreach").build(), cuda=True)[
        "optimizer"]["params"]
    assert params["torch_adam"] is True and params["foreach"] is True
    sgd = build_deepspeed_config(make_plan().deepspeed(2).optimizer("sgd").implementation("fused").build(),
                                 cuda=True)["optimizer"]
    assert sgd == {"type": "SGD", "params": {"lr": sgd["params"]["lr"], "momentum": 0.9, "fused": True}}


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_a_plan_with_fused_trains_under_ddp_and_fsdp(engine: str, train_local: Callable[..., Any]) -> None:
    """The whole trainer, one rank: fused AdamW over plain tensors (DDP) and FSDP2's DTensor shards."""
    builder = make_plan().implementation("fused").batch(2, 1).steps(2)
    builder = builder.fsdp(3) if engine == "fsdp" else builder.ddp()
    result = train_local(builder)
    assert result.steps == 2 and result.final_loss is not None

"""Trainer tier: real torch, DeepSpeed, bitsandbytes on CPU with gloo (1-2 ranks)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trainer_support import TORCH_EXTENSIONS_DIR, PlanBuilder

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.trainer)
            if "gpu" in item.keywords:
                import torch

                if not torch.cuda.is_available():
                    item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session")
def world1() -> Iterator[Any]:
    """A one-rank gloo process group in the test process (what the trainer sets up when not under torchrun)."""
    pytest.importorskip("torch")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", TORCH_EXTENSIONS_DIR)
    import torch
    from memfit_trainer import dist as mdist

    torch.set_num_threads(1)
    env = mdist.read_dist_env({})
    device = torch.device("cpu")
    mdist.init_distributed(env, device)
    yield env
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def train_local(world1: Any, tmp_path: Path) -> Callable[..., Any]:
    """Run a plan in this process (world size 1) and return its RunResult."""
    import torch
    from memfit_trainer.train import TrainOptions, run_training

    def run(plan: PlanBuilder, **options: Any) -> Any:
        return run_training(
            plan.build(), env=world1, device=torch.device("cpu"), options=TrainOptions(**options)
        )

    return run

"""Checkpoint layout, retention and resume: native restore, or weights only across strategies.

Layout under the plan's checkpointDir: one folder per saved step, `step-00000500/`, holding the
engine's files (DeepSpeed `save_checkpoint`, or torch.distributed.checkpoint for DDP/FSDP) and
`memfit.json`, written by rank 0 after every rank finished: a folder without it is incomplete and
ignored. `latest` names the newest complete folder (DeepSpeed's tools read it).

A re-plan may change engine, stage or world size. When the newest checkpoint cannot be restored
natively (see `native_resume`), the model weights are loaded from it (DeepSpeed ZeRO partitions are
merged with DeepSpeed's zero_to_fp32; DCP reshards) and the optimizer starts fresh; the step and
the data position are restored either way.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from memfit.api import pod as contract
from memfit.api.common import Precision
from memfit.api.plan import Plan
from torch import nn

from memfit_trainer import dist as mdist
from memfit_trainer.file_access import FileAccessError, diagnose

META_FILE = "memfit.json"
LATEST_FILE = "latest"
ENV_KEEP = contract.ENV_KEEP_CHECKPOINTS
DEFAULT_KEEP = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckpointMeta:
    """What a checkpoint holds and the strategy that wrote it."""

    step: int
    format: str
    engine: str
    zero_stage: int
    world_size: int
    precision: str
    offload: str
    optimizer: str
    optimizer8bit: bool
    loss: float | None
    samples: int
    seed: int
    # The job's first eval loss and its step (before training, on the first attempt): a resumed attempt
    # reports it as the "before" figure. None in older checkpoints and for jobs without an eval set.
    initial_eval_step: int | None = None
    initial_eval_loss: float | None = None

    @staticmethod
    def for_plan(*, plan: Plan, step: int, fmt: str, loss: float | None, seed: int,
                 initial_eval: tuple[int | None, float | None] = (None, None)) -> CheckpointMeta:
        """The metadata of the checkpoint of `step`; `initial_eval` is (step, loss) of the job's first eval."""
        assert plan.training is not None
        return CheckpointMeta(
            step=step,
            format=fmt,
            engine=plan.engine.value,
            zero_stage=plan.zero_stage,
            world_size=plan.world_size,
            precision=plan.precision.value,
            offload=plan.offload.value,
            optimizer=plan.training.optimizer.value,
            optimizer8bit=plan.optimizer8bit,
            loss=loss,
            samples=step * plan.training.global_batch_size,
            seed=seed,
            initial_eval_step=initial_eval[0],
            initial_eval_loss=initial_eval[1],
        )


def tag_for(step: int) -> str:
    """Folder name of the checkpoint after `step` optimizer steps."""
    return f"step-{step:08d}"


def read_meta(folder: Path) -> CheckpointMeta | None:
    """The metadata of a complete checkpoint folder, else None; FileAccessError when it may not be read
    (skipping it would silently resume from an older checkpoint, or from scratch)."""
    path = folder / META_FILE
    try:
        return CheckpointMeta(**json.loads(path.read_text(encoding="utf-8")))
    except PermissionError as error:
        raise FileAccessError(f"checkpoint {folder.name}: {diagnose(path, error)}") from error
    except (OSError, ValueError, TypeError):
        return None


def complete_checkpoints(directory: Path) -> list[tuple[str, CheckpointMeta]]:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for folder in directory.iterdir():
        if folder.is_dir() and folder.name.startswith("step-"):
            meta = read_meta(folder)
            if meta is not None:
                found.append((folder.name, meta))
    return sorted(found, key=lambda item: item[1].step)


def find_latest(directory: Path) -> tuple[str, CheckpointMeta] | None:
    """The newest complete checkpoint, if any."""
    found = complete_checkpoints(directory)
    return found[-1] if found else None


def native_resume(meta: CheckpointMeta, plan: Plan, fmt: str) -> bool:
    """True when the plan's runner can restore model and optimizer state from this checkpoint."""
    assert plan.training is not None
    same_optimizer = (
        meta.optimizer == plan.training.optimizer.value and meta.optimizer8bit == plan.optimizer8bit
    )
    # bf16-pure's optimizer (memfit_trainer.stochastic_rounding) is another class than torch's, with other
    # param-group settings: across bf16-pure and any other precision only the weights carry over.
    pure = Precision.BF16_PURE.value
    if meta.format != fmt or not same_optimizer or (meta.precision == pure) != (plan.precision == pure):
        return False
    if fmt == "deepspeed":
        return (
            meta.world_size == plan.world_size
            and meta.zero_stage == plan.zero_stage
            and meta.precision == plan.precision.value
            and meta.offload == plan.offload.value
        )
    # 8-bit state of FSDP shards is saved per rank and is not resharded.
    return not plan.optimizer8bit or (meta.engine == plan.engine.value and meta.world_size == plan.world_size)


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def finish_checkpoint(directory: Path, tag: str, meta: CheckpointMeta, *, keep: int) -> None:
    """Rank 0, after every rank saved: mark the folder complete, point `latest` at it, prune old ones."""
    _write_atomic(directory / tag / META_FILE, json.dumps(asdict(meta), indent=1))
    _write_atomic(directory / LATEST_FILE, tag)
    for old_tag, _ in complete_checkpoints(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(directory / old_tag, ignore_errors=True)


def keep_from_env(environ: dict[str, str] | os._Environ[str]) -> int:
    """How many complete checkpoints to keep (MEMFIT_KEEP_CHECKPOINTS, default 2)."""
    value = environ.get(ENV_KEEP, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_KEEP


def load_portable_weights(model: nn.Module, directory: Path, tag: str, meta: CheckpointMeta) -> None:
    """Load only the model weights of a checkpoint written by another strategy (collective for DCP)."""
    folder = directory / tag
    if meta.format == "deepspeed":
        state = _deepspeed_fp32_state(directory, tag, meta)
    else:
        import torch.distributed.checkpoint as dcp

        holder = {"model": {k: v for k, v in model.state_dict().items()}}
        dcp.load(holder, checkpoint_id=str(folder))
        state = holder["model"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(
            f"checkpoint {folder} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    log.info(
        "resumed weights only from %s (%s, %s ZeRO-%d)", folder, meta.format, meta.engine, meta.zero_stage
    )


def _deepspeed_fp32_state(directory: Path, tag: str, meta: CheckpointMeta) -> dict[str, torch.Tensor]:
    if meta.zero_stage == 0:
        # ZeRO-0 keeps whole parameters in the model-states file (16-bit under bf16/fp16).
        files = sorted((directory / tag).glob("mp_rank_*_model_states.pt"))
        module = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
        return {name: tensor.float() for name, tensor in module.items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return dict(get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag))


def barrier() -> None:
    """All ranks reach this point (no-op without a process group)."""
    mdist.barrier()

"""A fine-tune's ends: eval loss on `spec.data`'s eval set, and the trained model saved in Hugging Face
format (consolidated from FSDP / ZeRO-3 shards, with config and tokenizer) plus a training summary."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from memfit.api.common import Engine, Precision

from memfit_trainer.problems import TrainingProblem
from memfit_trainer.strategies.base import move_batch

SUMMARY_FILE = "memfit_training.json"
AUTOCAST = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}  # bf16-pure: none, the weights are bf16

log = logging.getLogger("memfit_trainer")


def evaluate(runner: Any, problem: TrainingProblem, *, micro_batch: int, precision: Precision,
             device: torch.device) -> float | None:
    """Mean next-token loss over every non-padding target of the eval set (None without one).

    Every rank runs the same forwards over the whole eval set through the wrapped model (FSDP and
    ZeRO-3 gather parameters collectively, so all ranks must run the same number of forwards); the
    result is the same on every rank without a reduction."""
    if problem.eval_batches is None:
        return None
    model = runner.model
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    engine_dtype = getattr(runner, "input_dtype", None)
    autocast_dtype = AUTOCAST.get(precision) if getattr(runner, "engine", "") == Engine.DDP.value else None
    try:
        for batch in problem.eval_batches(micro_batch):
            inputs = move_batch(batch, device, engine_dtype)
            context = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
                       else contextlib.nullcontext())
            with torch.no_grad(), context:
                logits = model(input_ids=inputs["input_ids"]).logits
            labels = inputs["labels"]
            total += float(F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"))
            count += int((labels != -100).sum())
    finally:
        model.train(was_training)
    return total / max(count, 1)


def consolidated_state(runner: Any) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (None elsewhere); a collective call for FSDP and ZeRO-3."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    if runner.engine == Engine.FSDP.value:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(runner.model, options=StateDictOptions(full_state_dict=True,
                                                                           cpu_offload=True))
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)} if rank == 0 else None
    if runner.engine == Engine.DEEPSPEED.value:
        if int(runner.model.zero_optimization_stage()) == 3:
            gathered = runner.model._zero3_consolidated_16bit_state_dict()  # gathers every partition
            return dict(gathered) if rank == 0 and gathered is not None else None
        module = runner.model.module
    else:
        module = runner.module
    return {k: v.detach().cpu() for k, v in module.state_dict().items()} if rank == 0 else None


def unwrapped(runner: Any) -> torch.nn.Module:
    """The transformers model under the engine's wrapper (for its config and save_pretrained)."""
    if runner.engine == Engine.DEEPSPEED.value:
        return runner.model.module  # type: ignore[no-any-return]
    return runner.problem.model  # type: ignore[no-any-return]


def save_model(runner: Any, problem: TrainingProblem, directory: Path, *, rank: int) -> Path | None:
    """Write the model (safetensors, config.json, generation config) and its tokenizer to `directory`
    on rank 0; every rank must call it (consolidation is collective). The folder loads with
    `AutoModelForCausalLM.from_pretrained`. Weights trained from a pretrained checkpoint are saved in
    that checkpoint's dtype (bf16 weights trained with fp32 master copies come back bf16, half the size),
    and config.json says so."""
    state = consolidated_state(runner)
    if rank != 0 or state is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    model = unwrapped(runner)
    dtype = problem.saved_dtype
    state = {k: _in_dtype(v.detach().to("cpu"), dtype).contiguous() for k, v in state.items()}
    model.save_pretrained(str(directory), state_dict=state, safe_serialization=True)  # type: ignore[operator]
    if dtype is not None:
        # save_pretrained names the dtype of the live parameters (fp32 master weights): name the saved one.
        config_path = directory / "config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config.pop("torch_dtype", None)
        config["dtype"] = str(dtype).removeprefix("torch.")
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if problem.tokenizer is not None:
        problem.tokenizer.save_pretrained(str(directory))
    return directory


def _in_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def write_summary(directory: Path, summary: dict[str, Any]) -> Path:
    """`memfit_training.json`: steps, losses, eval losses, data and timing of the run."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    return path

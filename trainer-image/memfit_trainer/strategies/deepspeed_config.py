"""The DeepSpeed config derived from a Plan: the one place that maps plan fields to DeepSpeed keys.

Pure (imports no torch or deepspeed), so `memfit-trainer deepspeed-config` can print it and the
operator can show it. Keys follow deepspeed/runtime/config.py and deepspeed/runtime/zero/config.py
(DeepSpeed 0.19).
"""

from __future__ import annotations

from typing import Any

from memfit.api.common import Offload, OptimizerImplementation, Precision
from memfit.api.job import OptimizerKind
from memfit.api.plan import Plan

from memfit_trainer.optim_kwargs import implementation_kwargs

# Dynamic fp16 loss scaling as in DeepSpeed's docs ("fp16" section): scale 2**16, halve on overflow,
# double after 1000 clean steps, tolerate 2 overflows before lowering (hysteresis).
FP16_LOSS_SCALING: dict[str, Any] = {
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}
# ZeRO-Infinity NVMe settings from DeepSpeed's ZeRO-3 offload tutorial (buffer_count >= 4 for the
# optimizer; 5 parameter buffers of 1e8 elements).
NVME_OPTIMIZER_BUFFERS = 4
NVME_PARAM_BUFFERS = 5
NVME_PARAM_BUFFER_ELEMENTS = 100_000_000
AIO: dict[str, Any] = {
    "block_size": 1_048_576,
    "queue_depth": 8,
    "thread_count": 1,
    "single_submit": False,
    "overlap_events": True,
}
# Never print DeepSpeed's own step log; the trainer logs and exports metrics itself.
NEVER = 2**31 - 1
ADAMW_WEIGHT_DECAY = 0.01
SGD_MOMENTUM = 0.9


def _offload_section(plan: Plan, *, cuda: bool, buffers: int) -> dict[str, Any]:
    section: dict[str, Any] = {"device": plan.offload.value, "pin_memory": cuda}
    if plan.offload == Offload.NVME:
        section |= {"nvme_path": plan.nvme_path, "buffer_count": buffers}
    return section


def hidden_size(plan: Plan) -> int | None:
    """The model's hidden size from the plan's problem (builtin shape or Hugging Face config), if known."""
    problem = plan.problem
    if problem is None:
        return None
    if problem.builtin is not None:
        return problem.builtin.hidden
    if problem.huggingface is not None and problem.huggingface.config:
        for key in ("hidden_size", "n_embd", "d_model"):
            value = problem.huggingface.config.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _bucket_sizes(plan: Plan) -> dict[str, Any]:
    """Communication buckets sized to the model, as the Hugging Face integration's "auto" values
    (transformers integrations/deepspeed.py: reduce_bucket_size = h*h, stage3_prefetch_bucket_size =
    0.9*h*h, stage3_param_persistence_threshold = 10*h). DeepSpeed's fixed defaults (5e8 elements)
    would hold a 2 GB fp32 gradient bucket even for a tiny model."""
    hidden = hidden_size(plan)
    if hidden is None:
        return {}
    square = hidden * hidden
    if plan.zero_stage == 3:
        return {
            "reduce_bucket_size": square,
            "stage3_prefetch_bucket_size": int(0.9 * square),
            "stage3_param_persistence_threshold": 10 * hidden,
        }
    return {"reduce_bucket_size": square, "allgather_bucket_size": square}


def _zero_section(plan: Plan, *, cuda: bool) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    if plan.zero_stage >= 1:
        zero |= {"contiguous_gradients": True, "overlap_comm": cuda} | _bucket_sizes(plan)
    if plan.offload != Offload.NONE and plan.zero_stage >= 1:
        zero["offload_optimizer"] = _offload_section(plan, cuda=cuda, buffers=NVME_OPTIMIZER_BUFFERS)
        if plan.zero_stage == 3:
            param = _offload_section(plan, cuda=cuda, buffers=NVME_PARAM_BUFFERS)
            if plan.offload == Offload.NVME:
                param["buffer_size"] = NVME_PARAM_BUFFER_ELEMENTS
            zero["offload_param"] = param
    return zero


def _optimizer_section(plan: Plan, *, cuda: bool) -> dict[str, Any] | None:
    """DeepSpeed builds 32-bit optimizers itself: DeepSpeedCPUAdam when offloading, FusedAdam on GPUs.

    8-bit optimizers are bitsandbytes client optimizers passed to deepspeed.initialize (no section).
    On CPU without offload, `torch_adam` avoids JIT-building FusedAdam (it is not used off-GPU).
    """
    if plan.optimizer8bit or plan.training is None:
        return None
    lr = plan.training.learning_rate
    kind = plan.training.optimizer
    how: dict[str, Any] = dict(implementation_kwargs(plan.optimizer_implementation))
    if kind == OptimizerKind.SGD:
        # Not a DeepSpeed optimizer name: DeepSpeed falls back to torch.optim.SGD (which takes `how`).
        return {"type": "SGD", "params": {"lr": lr, "momentum": SGD_MOMENTUM, **how}}
    params: dict[str, Any] = {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8}
    if kind == OptimizerKind.ADAMW:
        params["weight_decay"] = ADAMW_WEIGHT_DECAY
    fused_on_gpu = cuda and plan.optimizer_implementation == OptimizerImplementation.FUSED
    if plan.offload == Offload.NONE and (not cuda or (how and not fused_on_gpu)):
        # torch's AdamW: DeepSpeed passes `foreach` and any other key (`fused`) through; on a GPU, fused (or
        # unset) is DeepSpeed's own FusedAdam, which updates in place.
        params["torch_adam"] = True
        params.update(how)
    if kind == OptimizerKind.ADAM:
        params["adam_w_mode"] = False  # DeepSpeed's "Adam" type runs AdamW unless this is off
    return {"type": "AdamW" if kind == OptimizerKind.ADAMW else "Adam", "params": params}


def build_deepspeed_config(plan: Plan, *, cuda: bool) -> dict[str, Any]:
    """The config for deepspeed.initialize: batch, ZeRO stage, offload, precision and optimizer."""
    global_batch = (
        plan.training.global_batch_size
        if plan.training is not None
        else plan.global_batch(plan.world_size)
    )
    config: dict[str, Any] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "zero_optimization": _zero_section(plan, cuda=cuda),
        "bf16": {"enabled": plan.precision == Precision.BF16},
        "fp16": {"enabled": plan.precision == Precision.FP16}
        | (FP16_LOSS_SCALING if plan.precision == Precision.FP16 else {}),
        # DeepSpeed clips gradients at norm 1.0 unless told otherwise (runtime/constants.py
        # GRADIENT_CLIPPING_DEFAULT); DDP and FSDP do not, and a re-plan must not change the training.
        "gradient_clipping": 0.0,
        "steps_per_print": NEVER,
        "wall_clock_breakdown": False,
    }
    optimizer = _optimizer_section(plan, cuda=cuda)
    if optimizer is not None:
        config["optimizer"] = optimizer
    if optimizer is None or optimizer["type"] == "SGD":
        # A client (bitsandbytes) or torch optimizer under ZeRO: allowed, also with CPU offload.
        config["zero_allow_untested_optimizer"] = True
        config["zero_force_ds_cpu_optimizer"] = False
    if plan.offload == Offload.NVME:
        config["aio"] = dict(AIO)
    return config

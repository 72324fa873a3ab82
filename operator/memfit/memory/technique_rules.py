"""Which memory techniques of the best single-GPU trainers can run with which configuration.

- bf16-pure (bf16 weights, gradients and optimizer state, no fp32 copy; torchtune's default dtype,
  `dtype: bf16`): memfit_trainer runs it on DDP and FSDP2 with its stochastically rounded AdamW/SGD, or
  with bitsandbytes' 8-bit optimizer updating the bf16 weights in place (torchtune's low-memory
  single-device recipe). DeepSpeed always keeps an fp32 master partition, offloaded optimizers step on
  the host in fp32 and LoRA keeps its own adapters' dtype, so none of those combine.
- Optimizer step in backward (PyTorch tutorial "How to save memory by fusing the optimizer step into
  the backward pass"; torchtune `optimizer_in_bwd`): each parameter steps in its post-accumulate-grad
  hook, so no gradient survives to a later micro-step (no accumulation), there is no global gradient
  to clip or unscale (no fp16 loss scaling), and a data-parallel all-reduce would have to finish before
  the hook (memfit runs it on one GPU, like torchtune's single-device recipe).
- Chunked loss needs a language-model head (checked against the model's shape by the planner).
- Activation offload (saved-tensor hooks on memfit_trainer's blocks) is modelled for full fine-tunes; the
  LoRA/QLoRA terms (memory/peft.py) know no offloaded activations.
- The optimizer implementation (fused, foreach, for-loop) picks how torch's (and DeepSpeed's GPU)
  32-bit step runs; 8-bit, bf16-pure and offloaded optimizers run their own kernels
  (`memfit.api.training_config.optimizer_implementation_problem`).

Pure checks on the configuration; `memfit.memory.strategy.strategy_problem` calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memfit.api.common import Checkpointing, Engine, Offload, PeftMethod, Precision
from memfit.api.training_config import optimizer_implementation_problem

if TYPE_CHECKING:
    from memfit.memory.strategy import Strategy


def technique_problem(strategy: Strategy) -> str | None:
    """Why this configuration's techniques cannot run (None when they can)."""
    config = strategy.config
    if config.precision == Precision.BF16_PURE:
        if config.engine not in (Engine.DDP, Engine.FSDP):
            return "bf16-pure runs on ddp or fsdp (DeepSpeed keeps an fp32 master copy)"
        if config.offload != Offload.NONE:
            return "bf16-pure runs without offload (an offloaded optimizer steps fp32 states on the host)"
        if config.peft != PeftMethod.NONE:
            return "bf16-pure trains a full fine-tune, not LoRA/QLoRA"
    if config.optimizer_in_backward:
        if config.engine != Engine.DDP or strategy.world_size != 1:
            return "the optimizer step in backward runs on one GPU (engine ddp, world size 1)"
        if config.gradient_accumulation_steps != 1:
            return "the optimizer step in backward cannot accumulate gradients (accumulation must be 1)"
        if config.precision == Precision.FP16:
            return "the optimizer step in backward cannot unscale fp16 gradients (use bf16, bf16-pure or fp32)"
        if config.peft != PeftMethod.NONE:
            return "the optimizer step in backward trains a full fine-tune, not LoRA/QLoRA"
    if config.activation_offload and config.peft != PeftMethod.NONE:
        return "activation offload trains a full fine-tune, not LoRA/QLoRA"
    if config.activation_checkpointing == Checkpointing.SELECTIVE_OP and config.peft != PeftMethod.NONE:
        return "selective-op checkpointing trains a full fine-tune; LoRA/QLoRA use selective or full"
    if config.optimizer_implementation is not None:
        why = optimizer_implementation_problem(precision=config.precision, offload=config.offload,
                                               optimizer8bit=config.optimizer8bit)
        if why is not None:
            return f"the optimizer implementation cannot be chosen: {why}"
    return None

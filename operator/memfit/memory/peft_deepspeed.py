"""LoRA on DeepSpeed ZeRO-3: the frozen base and the adapters partitioned over N ranks, only the adapters
trainable, and ZeRO-Offload of the adapters' optimizer (with ZeRO-3's parameter offload).

What differs from a full fine-tune on ZeRO-3 (states.py `_deepspeed_states`, temporaries.py `_deepspeed`),
read off allocator timelines of real CPU steps (benchmarks/memory_timeline.py) and
deepspeed/runtime/zero/stage3.py:
- DeepSpeed casts the whole module to its dtype (engine `_configure_distributed_model`), the fp32
  adapters included: every parameter is partitioned at the training dtype (2 B under bf16/fp16, 4 B in
  fp32). The optimizer owns only the trainable parameters, so the fp32 master partition, the moments,
  the fp32 gradient partition and the persistent 16-bit gradient partition buffer cover the adapters
  only (A/N each).
- Gathered parameters at the activation peak: from the second step on (once ZeRO-3 has traced the
  module order) forward's gathers stay until backward (`stage3_max_reuse_distance` 1e9): every block's
  partitioned weights and adapters and the head (parameters under `stage3_param_persistence_threshold`,
  10 h elements, are never partitioned: they are in the partition count already), at most
  `stage3_max_live_parameters` (1e9) elements of them; the input embeddings, which no gradient reaches,
  are released. At world size 1 the partition is the whole
  tensor and nothing is gathered (no all-gather allocation in the timeline). One reduce bucket
  (`reduce_bucket_size` h^2 at the training dtype) stays allocated.
- No gradient of the frozen head; no autocast weight copies (the adapters are at the training dtype).
- Optimizer step: torch's AdamW on the flat fp32 adapter partition (one tensor: 2 x 4 B x A/N on CPU);
  DeepSpeedCPUAdam when offloaded steps in place.
- Offload: on CUDA the master, moments and fp32 gradient partition (offload_optimizer) and the 16-bit
  partitions (offload_param, stage 3) live in host RAM; on a CPU device the "host" is the device, so
  they stay counted where they are (what the CPU truth measures).
QLoRA does not run on DeepSpeed (its Params4bit base is cast and partitioned as ordinary tensors).
"""

from __future__ import annotations

from memfit.api.common import Offload
from memfit.memory.adapter import AdapterLayout
from memfit.memory.shape import Shape
from memfit.memory.states import FP32_GRAD_PARTITION_BYTES, FP32_MASTER_BYTES, HOST_BUFFER_FACTOR, ModelStates
from memfit.memory.strategy import Device, Strategy
from memfit.memory.temporaries import DS_MAX_LIVE_PARAMETERS, PhaseBytes, adam_scratch


def _weight_bytes(strategy: Strategy) -> float:
    return 2.0 if strategy.mixed_precision else 4.0


def deepspeed_peft_states(shape: Shape, strategy: Strategy, *, adapters: float, optimizer_bytes: float) -> ModelStates:
    """ZeRO-3 partitions of the base and the adapters at the training dtype; the adapters' fp32 master and
    optimizer state (`optimizer_bytes` over all A) per rank; offloaded to the host on CUDA."""
    n = strategy.world_size
    params = _weight_bytes(strategy) * (shape.parameters + adapters) / n
    optimizer = (optimizer_bytes + FP32_MASTER_BYTES * adapters) / n
    grads = FP32_GRAD_PARTITION_BYTES * adapters / n
    buffers = float(shape.buffer_bytes)
    if strategy.config.offload == Offload.CPU and strategy.device == Device.CUDA:
        host = (params + optimizer + grads) * HOST_BUFFER_FACTOR
        return ModelStates(buffers, 0.0, 0.0, host)
    return ModelStates(params + buffers, grads, optimizer)


def deepspeed_peft_phases(shape: Shape, strategy: Strategy, layout: AdapterLayout, *, adapters: float) -> PhaseBytes:
    """ZeRO-3 phases with only the adapters trainable (see the module docstring)."""
    n = strategy.world_size
    weight_bytes = _weight_bytes(strategy)
    offloaded = strategy.config.offload != Offload.NONE
    on_host = offloaded and strategy.device == Device.CUDA
    # One reduce bucket (`reduce_bucket_size` h^2 elements at the training dtype) stays allocated.
    bucket = weight_bytes * min(float(shape.hidden * shape.hidden), adapters)
    low_grads = weight_bytes * adapters / n  # the persistent 16-bit gradient partition
    fp32_grads = FP32_GRAD_PARTITION_BYTES * adapters / n
    # Offloaded, the fp32 gradient partition is one buffer allocated at start (on the host), alive
    # throughout; otherwise it is built for the step.
    step_grads = 0.0 if offloaded else fp32_grads
    persistent = bucket + (0.0 if on_host else low_grads + (fp32_grads if offloaded else 0.0))
    gathered = 0.0
    if n > 1:
        head = float(shape.vocab * shape.hidden)
        # At most `stage3_max_live_parameters` elements stay gathered, as for a full fine-tune (issue 29:
        # without the cap a 70B LoRA over 8 GPUs was over-predicted 3x).
        gathered = weight_bytes * min(float(DS_MAX_LIVE_PARAMETERS), shape.layers * shape.block_parameters
                                      + adapters + head)
    unit = weight_bytes * (shape.block_parameters + layout.adapter_parameters_per_block)
    scratch = 0.0
    if not offloaded:
        # DeepSpeed's flat fp32 partition of the adapters is one tensor.
        scratch = adam_scratch(strategy, elements=adapters / n, largest=adapters / n)
    return PhaseBytes(
        persistent_bytes=persistent,
        with_activations_bytes=gathered,
        in_backward_gradient_bytes=0.0,
        in_backward_bytes=0.0,
        late_gradient_bytes=0.0,
        late_backward_bytes=unit if n > 1 else 0.0,
        held_gradient_bytes=0.0,
        backward_end_bytes=gathered,
        step_gradient_bytes=step_grads,
        step_temporary_bytes=scratch,
    )

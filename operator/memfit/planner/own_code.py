"""The space of a job that runs its own container: the engine and offload its script can run, from
`spec.container.honors` (memfit.api.own_code); the knobs it does not apply are pinned by the spec itself
(memfit.api.own_code_rules refuses a job where they are not). The memory techniques of memfit's own
trainer (bf16-pure, the optimizer step in backward, the chunked loss, activation offload) are never planned for a script: it
would have to implement them."""

from __future__ import annotations

from memfit.api.common import Engine, Offload, Toggle
from memfit.api.job import MemoryOptimizedTrainingJobSpec


def with_container_pins(spec: MemoryOptimizedTrainingJobSpec) -> MemoryOptimizedTrainingJobSpec:
    """`spec` with the engine (and no offload, without a DeepSpeed config) its container runs; the same spec
    for memfit's own trainer."""
    container = spec.container
    if container is None:
        return spec
    strategy = spec.strategy
    update: dict[str, object] = {"allow_pure_bf16": False}
    if strategy.optimizer_in_backward == Toggle.AUTO:
        update["optimizer_in_backward"] = Toggle.DISABLED
    if strategy.chunked_loss == Toggle.AUTO:
        update["chunked_loss"] = Toggle.DISABLED
    if strategy.activation_offload == Toggle.AUTO:
        update["activation_offload"] = Toggle.DISABLED
    if strategy.engine == Engine.AUTO:
        update["engine"] = container.engine
    if container.offload is not None and strategy.offload == Offload.AUTO:
        update["offload"] = container.offload
    return spec.model_copy(update={"strategy": strategy.model_copy(update=update)})

"""torch.optim's implementation switches for a plan's `optimizerImplementation`. Pure (no torch import): the
DeepSpeed config (strategies/deepspeed_config.py) passes the same keys through to torch's optimizers."""

from __future__ import annotations

from memfit.api.common import OptimizerImplementation


def implementation_kwargs(implementation: OptimizerImplementation | None) -> dict[str, bool]:
    """torch.optim's `fused=` / `foreach=` for the plan's optimizerImplementation; none when unset (torch's
    own default: foreach for CUDA tensors, the per-tensor loop on a CPU)."""
    if implementation == OptimizerImplementation.FUSED:
        return {"fused": True}
    if implementation == OptimizerImplementation.FOREACH:
        return {"foreach": True}
    if implementation == OptimizerImplementation.FOR_LOOP:
        return {"foreach": False}
    return {}

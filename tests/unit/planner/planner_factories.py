"""Fluent factories for planner tests: jobs, pools, and an independent brute-force planner."""

from __future__ import annotations

import copy
from typing import Any

from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.api.training_config import TrainingConfig
from memfit.catalog import CATALOG, find_gpu
from memfit.memory import Shape, Strategy, estimate_step_seconds, predict_memory, strategy_problem
from memfit.planner import resolve_offers, resolve_shape, search_context

GIB = 1024**3
LLAMA_1B_CONFIG = {
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "tie_word_embeddings": True,
}
LLAMA_7B_CONFIG = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
}


class JobBuilder:
    """`make_job().gpt(layers=24).batch(64).pin(precision="bf16").baseline("a100-80").build()`."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] = {
            "problem": {"builtin": {"kind": "gpt", "layers": 4, "hidden": 256, "heads": 4, "vocab": 1000,
                                    "sequenceLength": 256}},
            "training": {"globalBatchSize": 8, "maxSteps": 100},
            "placement": {"maxNodes": 2},
        }

    def gpt(self, **shape: Any) -> JobBuilder:
        self.spec["problem"] = {"builtin": {**self.spec["problem"].get("builtin", {"kind": "gpt"}), **shape}}
        return self

    def hf(self, config: dict[str, Any], seq: int = 2048) -> JobBuilder:
        self.spec["problem"] = {"huggingface": {"model": "org/model", "config": config, "sequenceLength": seq}}
        return self

    def entrypoint(self, target: str = "pkg.mod:problem") -> JobBuilder:
        self.spec["problem"] = {"entrypoint": target}
        return self

    def batch(self, global_batch: int) -> JobBuilder:
        self.spec["training"]["globalBatchSize"] = global_batch
        return self

    def steps(self, steps: int) -> JobBuilder:
        self.spec["training"]["maxSteps"] = steps
        return self

    def optimizer(self, kind: str) -> JobBuilder:
        self.spec["training"]["optimizer"] = kind
        return self

    def pin(self, **strategy: Any) -> JobBuilder:
        self.spec.setdefault("strategy", {}).update(strategy)
        return self

    def pools(self, *names: str) -> JobBuilder:
        self.spec["placement"]["nodePools"] = list(names)
        return self

    def max_nodes(self, n: int) -> JobBuilder:
        self.spec["placement"]["maxNodes"] = n
        return self

    def baseline(self, pool: str, nodes: int = 1) -> JobBuilder:
        self.spec["placement"]["baseline"] = {"nodePool": pool, "nodes": nodes}
        return self

    def objective(self, **objective: Any) -> JobBuilder:
        self.spec.setdefault("objective", {}).update(objective)
        return self

    def headroom(self, percent: int) -> JobBuilder:
        return self.objective(memoryHeadroomPercent=percent)

    def build(self) -> MemoryOptimizedTrainingJobSpec:
        return MemoryOptimizedTrainingJobSpec.model_validate(copy.deepcopy(self.spec))


def make_job() -> JobBuilder:
    return JobBuilder()


def make_pool(name: str, product: str = "l4", *, per_node: int = 1, price: float | None = None,
              memory_mib: int | None = None, max_nodes: int = 4, host_gib: int | None = None,
              nvme_gib: int | None = None, bf16_tflops: float | None = None, **spec: Any) -> GPUNodePool:
    """A GPUNodePool; unset fields fall back to the catalog like a real pool."""
    gpu: dict[str, Any] = {"product": product, "perNode": per_node}
    if memory_mib is not None:
        gpu["memoryMiB"] = memory_mib
    if bf16_tflops is not None:
        gpu["bf16TFLOPS"] = bf16_tflops
    host: dict[str, Any] = {}
    if host_gib is not None:
        host["memoryGiB"] = host_gib
    if nvme_gib is not None:
        host["nvmeGiB"] = nvme_gib
    body: dict[str, Any] = {"gpu": gpu, "maxNodes": max_nodes, "host": host, **spec}
    if price is not None:
        body["pricePerNodeHour"] = price
    else:
        known = find_gpu(product)
        if known is not None:
            body["pricePerNodeHour"] = round(known.price_per_gpu_hour * per_node, 4)
    return GPUNodePool.model_validate({"metadata": {"name": name}, "spec": body})


def brute_force_cost(spec: MemoryOptimizedTrainingJobSpec, pools: list[GPUNodePool]) -> float | None:
    """The cheapest fitting total cost by enumerating everything, micro-batches included, with the
    public memory and time functions and no pruning (independent of the planner's search)."""
    shape = resolve_shape(spec, None)
    assert not isinstance(shape, str)
    ctx = search_context(spec, shape)
    hot: Shape = ctx.shape
    offers, _ = resolve_offers(pools, allowed=spec.placement.node_pools, catalog=CATALOG)
    g_batch, headroom = spec.training.global_batch_size, spec.objective.memory_headroom_percent
    best: float | None = None
    for offer in offers:
        for layout in offer.layouts(spec.placement.max_nodes):
            n = layout.world_size
            if g_batch % n:
                continue
            per_gpu = g_batch // n
            for engine in (Engine.DDP, Engine.FSDP, Engine.DEEPSPEED):
                for stage in range(4):
                    for precision in (Precision.BF16, Precision.FP16, Precision.FP32):
                        if precision == Precision.BF16 and not offer.supports_bf16:
                            continue
                        for ckpt in (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL):
                            for offload in (Offload.NONE, Offload.CPU, Offload.NVME):
                                if offload == Offload.CPU and offer.host_bytes_per_node is None:
                                    continue
                                for eight in (False, True):
                                    for b in (d for d in range(1, per_gpu + 1) if per_gpu % d == 0):
                                        config = TrainingConfig.model_construct(
                                            engine=engine, zero_stage=stage, precision=precision,
                                            activation_checkpointing=ckpt, offload=offload, optimizer8bit=eight,
                                            micro_batch_size=b, gradient_accumulation_steps=per_gpu // b)
                                        s = Strategy(config, spec.training.optimizer, n, layout.gpus_per_node)
                                        if strategy_problem(s):
                                            continue
                                        m = predict_memory(hot, s)
                                        if m.peak_bytes * (1 + headroom / 100) > offer.usable_bytes:
                                            continue
                                        g = layout.gpus_per_node
                                        if offload != Offload.NONE and m.host_bytes * g > offer.host_usable_bytes_per_node:
                                            continue
                                        if m.nvme_bytes * g > offer.nvme_bytes_per_node:
                                            continue
                                        t = estimate_step_seconds(hot, s, offer.speed)
                                        cost = spec.training.max_steps * t.step_seconds / 3600 * layout.price_per_hour
                                        best = cost if best is None else min(best, cost)
    return best

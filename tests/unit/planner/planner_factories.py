"""Fluent factories for planner tests: jobs, pools, and an independent brute-force planner."""

from __future__ import annotations

import copy
from typing import Any

from memfit.api.job import MemoryOptimizedTrainingJobSpec
from memfit.api.pool import GPUNodePool
from memfit.catalog import find_gpu

GIB = 1024**3
LLAMA_1B_CONFIG = {
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "tie_word_embeddings": True,
}
LLAMA_70B_CONFIG = {
    "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
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

    def peft(self, method: str, *allowed: str, **settings: Any) -> JobBuilder:
        """`strategy.peft`: `peft("auto", "none", "lora")`, `peft("qlora", lora={"rank": 8})`."""
        peft: dict[str, Any] = {"method": method, **settings}
        if allowed:
            peft["allowed"] = list(allowed)
        return self.pin(peft=peft)

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
              nvme_gib: int | None = None, bf16_tflops: float | None = None,
              gpu_extra: dict[str, Any] | None = None, **spec: Any) -> GPUNodePool:
    """A GPUNodePool; unset fields fall back to the catalog like a real pool."""
    gpu: dict[str, Any] = {"product": product, "perNode": per_node, **(gpu_extra or {})}
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

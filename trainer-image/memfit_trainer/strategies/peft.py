"""LoRA and QLoRA applied to a problem's model: frozen base (16-bit, or 4-bit with bitsandbytes), trainable
low-rank adapters, and adapter files in the `peft` library's layout.

LoRA (Hu et al. 2021): each targeted linear layer W gets A (r x in, Kaiming-uniform) and B (out x r,
zeros) in fp32; the layer computes W x + B A dropout(x) x alpha / r, as `peft.tuners.lora.Linear` does
(its modules are named `base_layer`, `lora_A`, `lora_B`, `lora_dropout`, so the saved keys match
`peft`'s `base_model.model.<module>.lora_A.weight`). QLoRA (Dettmers et al. 2023): every linear layer
of the blocks becomes a `bitsandbytes.nn.Linear4bit` (NF4/FP4, blocksize 64, optional double
quantisation) dequantised to the compute dtype, and the rest of the base is cast to it. A small own
implementation instead of `peft` keeps `transformers` out of the trainer image and makes every tensor
the memory model counts visible here.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from memfit.api.common import Engine, PeftMethod, Precision
from memfit.api.peft import AdapterSettings
from torch import nn

from memfit_trainer.problems import TrainingProblem

BASE_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16, Precision.FP32: torch.float32}
ADAPTER_CONFIG = "adapter_config.json"
MEMFIT_ADAPTER = "memfit_adapter.json"  # memfit's own facts, beside peft's config (peft warns on extra keys)
ADAPTER_WEIGHTS = "adapter_model.bin"
PEFT_PREFIX = "base_model.model."


class PeftError(ValueError):
    """The plan's adapter settings do not fit the model (unknown target, rank too large)."""


class LoraLinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (fp32 adapters, as peft keeps them)."""

    def __init__(self, base: nn.Module, *, in_features: int, out_features: int, rank: int, alpha: int,
                 dropout: float) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, out_features, bias=False)
        self.lora_dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / rank
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # peft's default init
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        update = self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
        return result + update.to(result.dtype)


def _quantize_linear(linear: nn.Linear, *, adapter: AdapterSettings, compute: torch.dtype,
                     storage: torch.dtype) -> nn.Module:
    import bitsandbytes as bnb

    quantized = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                  compute_dtype=compute, compress_statistics=adapter.double_quant,
                                  quant_type=adapter.quant_type.value, quant_storage=storage)
    # `module=` keeps the quantisation state on the layer too: FSDP replaces the parameter with its own
    # (sharded, then gathered) tensors, and Linear4bit.forward restores the state from the module.
    quantized.weight = bnb.nn.Params4bit(linear.weight.data.to(torch.float32).contiguous(), requires_grad=False,
                                         quant_type=adapter.quant_type.value,
                                         compress_statistics=adapter.double_quant, quant_storage=storage,
                                         module=quantized)
    if linear.bias is not None:
        quantized.bias = nn.Parameter(linear.bias.data.to(compute), requires_grad=False)
    return quantized


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _block_linears(problem: TrainingProblem) -> list[tuple[str, nn.Linear]]:
    names = {id(m): n for n, m in problem.model.named_modules()}
    found: list[tuple[str, nn.Linear]] = []
    for block in problem.blocks:
        prefix = names[id(block)]
        found += [(f"{prefix}.{n}", m) for n, m in block.named_modules() if isinstance(m, nn.Linear)]
    return found


def target_problems(problem: TrainingProblem, targets: list[str], rank: int) -> list[str]:
    """Why adapters of `rank` on `targets` do not fit the model's blocks (empty when they do): a name
    that is no linear layer of a block, or a rank above a targeted layer's smaller side."""
    linears = _block_linears(problem)
    names = {n.rpartition(".")[2] for n, _ in linears}
    found: list[str] = []
    missing = sorted(set(targets) - names)
    if missing:
        found.append(f"target modules {missing} are not linear layers of the model's blocks; it has: "
                     f"{', '.join(sorted(names))}")
    for name, linear in linears:
        if name.rpartition(".")[2] in targets and rank > min(linear.in_features, linear.out_features):
            found.append(f"rank {rank} is larger than {name} ({linear.in_features} -> {linear.out_features})")
            break
    return found


def apply_peft(problem: TrainingProblem, *, method: PeftMethod, adapter: AdapterSettings | None,
               precision: Precision, device: torch.device, engine: Engine = Engine.DDP) -> int:
    """Freeze the base (16-bit, or 4-bit for QLoRA), add adapters to the targets; the adapters' parameter
    count. Call before checkpointing is applied and before the engine wraps the model.

    QLoRA packs its 4-bit weights in uint8, or for FSDP in the base's dtype (`quant_storage`, as the
    FSDP+QLoRA recipe does): FSDP2's MixedPrecisionPolicy casts every parameter to the compute dtype at
    gather, which must leave the packed bytes unchanged, and shards them like any other tensor."""
    if method == PeftMethod.NONE:
        return 0
    if adapter is None:
        raise PeftError("a LoRA/QLoRA plan needs adapter settings (plan.adapter)")
    model = problem.model
    base_dtype = BASE_DTYPES[precision]
    model.requires_grad_(False)
    model.to(base_dtype)
    linears = _block_linears(problem)
    targets = set(adapter.target_modules)
    problems = target_problems(problem, list(adapter.target_modules), adapter.rank)
    if problems:
        raise PeftError("; ".join(problems))
    replaced: dict[str, nn.Module] = {}
    for name, linear in linears:
        base: nn.Module = linear
        if method == PeftMethod.QLORA:
            storage = base_dtype if engine == Engine.FSDP else torch.uint8
            base = _quantize_linear(linear, adapter=adapter, compute=base_dtype, storage=storage)
        if name.rpartition(".")[2] in targets:
            base = LoraLinear(base, in_features=linear.in_features, out_features=linear.out_features,
                              rank=adapter.rank, alpha=adapter.alpha, dropout=adapter.dropout)
        if base is not linear:
            replaced[name] = base
    for name, module in replaced.items():
        _replace(model, name, module)
    model.to(device)  # bitsandbytes quantises Params4bit when they are moved to the device
    return sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)


def full_parameters(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """Every parameter whole for the duration: a collective under DeepSpeed ZeRO-3 (partitions between its
    hooks) and FSDP2 (sharded DTensors; every unit is unsharded, then resharded), so every rank must
    enter; nothing to do for DDP."""
    params = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return _fsdp_unsharded(model)


@contextlib.contextmanager
def _fsdp_unsharded(model: nn.Module) -> Iterator[None]:
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights under peft's key names (`base_model.model.<module>.lora_A.weight`)."""
    return {PEFT_PREFIX + n: p.detach().cpu().clone() for n, p in model.named_parameters() if ".lora_" in n}


def save_adapter(model: nn.Module, directory: Path, *, method: PeftMethod, adapter: AdapterSettings,
                 base_model: str = "") -> Path:
    """Write the adapter as `peft` does (adapter_config.json + weights), loadable with
    `PeftModel.from_pretrained`; returns the folder."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(adapter_state(model), directory / ADAPTER_WEIGHTS)
    config: dict[str, Any] = {
        "peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model, "r": adapter.rank,
        "lora_alpha": adapter.alpha, "lora_dropout": adapter.dropout,
        "target_modules": sorted(adapter.target_modules), "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True,
    }
    facts: dict[str, Any] = {"method": method.value}
    if method == PeftMethod.QLORA:
        facts["quantization"] = {"quant_type": adapter.quant_type.value,
                                 "double_quant": adapter.double_quant, "blocksize": 64}
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    (directory / MEMFIT_ADAPTER).write_text(json.dumps(facts, indent=2, sort_keys=True))
    return directory


MERGED_WEIGHTS = "model_merged.pt"
EVAL_FILE = "memfit_eval.json"
EVAL_SAMPLES = 4


def eval_loss(problem: TrainingProblem, precision: Precision, *, seed: int, step: int,
              device: torch.device) -> float:
    """The model's loss on the first samples of step `step`'s data (no update): what a reloaded adapter
    must reproduce."""
    from memfit_trainer.problems import BatchKey

    batch = problem.make_batch(BatchKey(seed=seed, step=step, sample_start=0, samples=EVAL_SAMPLES))
    inputs = {k: v.to(device) for k, v in batch.items()}
    dtype = BASE_DTYPES[precision]
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        return float(problem.loss_fn(problem.model, inputs).item())


def write_eval_loss(problem: TrainingProblem, plan: Any, directory: Path, *, seed: int,
                    device: torch.device, write: bool = True) -> None:
    """`memfit_eval.json` beside the adapter: the trained model's loss on the batch after the last step.
    Every rank computes it (a sharded model's forward is a collective); only `write` ranks write it."""
    step = plan.training.max_steps + 1
    loss = eval_loss(problem, plan.precision, seed=seed, step=step, device=device)
    if write:
        record = {"step": step, "samples": EVAL_SAMPLES, "seed": seed, "loss": loss}
        (directory / EVAL_FILE).write_text(json.dumps(record, sort_keys=True))


def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights with every adapter merged in (W + B A alpha / r; a 4-bit base is dequantised
    to its compute dtype first), under the base model's own parameter names."""
    import bitsandbytes as bnb

    state: dict[str, torch.Tensor] = {}
    lora = {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}
    for name, module in model.named_modules():
        if isinstance(module, LoraLinear):
            base = module.base_layer
            weight = base.weight
            if isinstance(base, bnb.nn.Linear4bit):  # FSDP's gathered tensor: the state is on the layer
                weight = bnb.functional.dequantize_4bit(weight.data, getattr(weight, "quant_state", None)
                                                        or base.quant_state)
            delta = (module.lora_B.weight.float() @ module.lora_A.weight.float()) * module.scaling
            state[f"{name}.weight"] = (weight.float() + delta).to(weight.dtype).detach().cpu()
            if getattr(base, "bias", None) is not None:
                state[f"{name}.bias"] = base.bias.detach().cpu()
            continue
        if any(name == n or name.startswith(f"{n}.") for n in lora):
            continue
        for pname, param in module.named_parameters(recurse=False):
            data = param.data
            if isinstance(module, bnb.nn.Linear4bit) and pname == "weight":  # a quantised layer, no adapter
                data = bnb.functional.dequantize_4bit(data, getattr(param, "quant_state", None) or module.quant_state)
            state[f"{name}.{pname}" if name else pname] = data.detach().cpu().clone()
    return state


def save_merged(model: nn.Module, directory: Path) -> Path:
    """Write the merged model's state dict (loads into the problem's original model)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MERGED_WEIGHTS
    torch.save(merged_state(model), path)
    return path


def load_adapter(model: nn.Module, directory: Path) -> int:
    """Load adapter weights saved by `save_adapter` into a model with the same adapters; tensors loaded."""
    state = torch.load(directory / ADAPTER_WEIGHTS, map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    for key, value in state.items():
        params[key.removeprefix(PEFT_PREFIX)].data.copy_(value)
    return len(state)

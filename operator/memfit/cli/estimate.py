"""`memfit estimate`: the memory model's per-GPU breakdown of one configuration.

The job's pinned strategy fields and the flags fix what they name; the memory model's
`strategy_from_pins` reads the rest (`auto`) as the usual setup. Exit codes: 0 done, 2 invalid input.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memfit.api.common import (
    Checkpointing,
    Engine,
    Offload,
    OptimizerImplementation,
    PeftMethod,
    Precision,
    Toggle,
)
from memfit.api.job import MemoryOptimizedTrainingJob, OptimizerKind, StrategySpec
from memfit.api.peft import adapter_settings
from memfit.api.problem import Attention, BuiltinProblem, HuggingFaceProblem, Task
from memfit.api.profile import ModelShape
from memfit.api.validation import violations_from
from memfit.catalog import CATALOG
from memfit.cli.inputs import InputError, load_job, load_profile
from memfit.cli.render import breakdown_table
from memfit.memory import (
    Calibration,
    Device,
    Shape,
    ShapeError,
    Strategy,
    calibrate,
    predict_memory,
    shape_from_problem,
    strategy_from_pins,
    strategy_problem,
)
from memfit.memory.adapter import adapter_layout
from memfit.planner import PoolRejection, catalog_pools
from memfit.planner.offers import resolve_offer
from memfit.timing import estimate_step_seconds


def parse_builtin(text: str) -> BuiltinProblem:
    """`gpt:layers=24,hidden=2048,heads=16,vocab=32000,seq=2048` -> BuiltinProblem."""
    kind, _, rest = text.partition(":")
    aliases = {"seq": "sequence_length", "ffn": "ffn_hidden", "image": "image_size", "patch": "patch_size",
               "classes": "num_classes"}
    fields: dict[str, Any] = {"kind": kind.strip()}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError([f"--builtin: {item!r} is not key=value"])
        name = aliases.get(key.strip(), key.strip())
        try:
            fields[name] = int(value)
        except ValueError:
            raise InputError([f"--builtin.{key.strip()}: {value!r} is not an integer"]) from None
    try:
        return BuiltinProblem.model_validate(fields)
    except ValidationError as error:
        raise InputError([str(v) for v in violations_from(error, "--builtin")]) from None


def _estimate_shape(args: argparse.Namespace) -> tuple[ModelShape | None, MemoryOptimizedTrainingJob | None]:
    """The analytic shape of the problem; None for user code when a profile will give it."""
    if args.job:
        job = load_job(Path(args.job))
        try:
            return shape_from_problem(job.spec.problem), job
        except ShapeError as error:
            if args.profile:  # entrypoints: the shape and the activations come from the profile
                return None, job
            raise InputError([f"{args.job}: spec.{error} (pass --profile P.json from `memfit-trainer profile`)"]
                             ) from None
    if args.hf_config:
        path = Path(args.hf_config)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise InputError([f"{path}: cannot read JSON: {error}"]) from None
        try:
            spec = HuggingFaceProblem(model="local/config", config=config, sequence_length=args.seq,
                                      attention=Attention(args.attention), task=Task(args.task))
            return shape_from_problem(spec), None
        except ValidationError as error:
            raise InputError([str(v) for v in violations_from(error, str(path))]) from None
        except ShapeError as error:
            raise InputError([f"{path}: {error}"]) from None
    try:
        return shape_from_problem(parse_builtin(args.builtin)), None
    except ShapeError as error:
        raise InputError([f"--builtin: {error}"]) from None


def _estimate_strategy(args: argparse.Namespace, job: MemoryOptimizedTrainingJob | None) -> Strategy:
    """The job's pinned strategy fields (if any), overridden by the flags; `auto` left to the memory
    model's estimate defaults."""
    flags: dict[str, Any] = {
        "engine": Engine(args.engine) if args.engine else None,
        "zero_stage": args.stage,
        "precision": Precision(args.precision) if args.precision else None,
        "activation_checkpointing": Checkpointing(args.checkpointing) if args.checkpointing else None,
        "offload": Offload(args.offload) if args.offload else None,
        "optimizer8bit": Toggle.ENABLED if args.optimizer8bit else None,
        "optimizer_in_backward": Toggle.ENABLED if args.optimizer_in_backward else None,
        "chunked_loss": Toggle.ENABLED if args.chunked_loss else None,
        "activation_offload": Toggle.ENABLED if args.activation_offload else None,
        "optimizer_implementation": (OptimizerImplementation(args.optimizer_implementation)
                                     if args.optimizer_implementation else None),
        "micro_batch_size": args.micro_batch or None,
    }
    pins = job.spec.strategy if job is not None else StrategySpec()
    pins = pins.model_copy(update={k: v for k, v in flags.items() if v is not None})
    if args.peft or args.lora_rank or args.lora_targets:
        lora = pins.peft.lora.model_copy(update={k: v for k, v in {
            "rank": args.lora_rank, "target_modules": args.lora_targets.split(",") if args.lora_targets else None,
        }.items() if v})
        method = PeftMethod(args.peft) if args.peft else pins.peft.method
        pins = pins.model_copy(update={"peft": pins.peft.model_copy(
            update={"method": method, "allowed": [], "lora": lora})})
    optimizer = OptimizerKind(args.optimizer) if args.optimizer else (
        job.spec.training.optimizer if job else OptimizerKind.ADAMW
    )
    strategy = strategy_from_pins(
        pins, optimizer=optimizer, world_size=args.world_size, gpus_per_node=args.gpus_per_node,
        global_batch_size=job.spec.training.global_batch_size if job else None,
        accumulation_steps=args.accumulation, device=Device(args.device),
    )
    if strategy.config.peft == PeftMethod.NONE:
        return strategy
    wire = _problem_wire(args, job)
    settings = adapter_settings(wire, pins.peft)
    layout = adapter_layout(wire, settings) if settings is not None else None
    if layout is None:
        raise InputError(["--peft: LoRA/QLoRA estimates need a model whose linear layers memfit knows "
                          "(builtin, llama, mistral, qwen2, qwen3, gpt2, bert, vit)"])
    return replace(strategy, adapter=layout)


def _problem_wire(args: argparse.Namespace, job: MemoryOptimizedTrainingJob | None) -> dict[str, Any]:
    if job is not None:
        return job.spec.problem.to_wire()
    if args.hf_config:
        config = json.loads(Path(args.hf_config).read_text(encoding="utf-8"))
        return {"huggingface": {"model": "local/config", "config": config, "attention": args.attention,
                                "task": args.task}}
    return {"builtin": parse_builtin(args.builtin).to_wire()}


def cmd_estimate(args: argparse.Namespace) -> int:
    """`memfit estimate (--job J | --hf-config C [--seq N] | --builtin SPEC) [strategy options]`."""
    try:
        shape, job = _estimate_shape(args)
        strategy = _estimate_strategy(args, job)
        problem = strategy_problem(strategy)
        if problem is not None:
            raise InputError([f"strategy: {problem}"])
        profile = load_profile(Path(args.profile)) if args.profile else None
        gpu = CATALOG.find(args.gpu) if args.gpu else None
        if args.gpu and gpu is None:
            raise InputError([f"--gpu: {args.gpu!r} is not in the catalog ({', '.join(g.key for g in CATALOG)})"])
    except InputError as error:
        return error.report()
    if profile is not None and profile.shape is not None:
        shape = profile.shape
    if shape is None:
        reason = f" (profiling failed: {profile.error})" if profile is not None and profile.error else ""
        return InputError([f"{args.profile}: the profile has no model shape{reason}"]).report()
    hot = Shape.of(shape)
    calibration: Calibration | None = None
    if profile is not None and (profile.measurements or profile.activation_curves):
        calibration = calibrate(profile, hot)  # with the optimizer the profile's steps ran
    memory = predict_memory(hot, strategy, calibration=calibration)
    sources = calibration.sources(strategy) if calibration is not None else dict.fromkeys(
        ("parameters", "optimizer", "activations", "step", "fragmentation"), "analytic")
    if args.json:
        print(json.dumps({**memory.to_breakdown().to_wire(), "sources": sources}, indent=2))
        return 0
    print(f"memfit estimate: {shape.parameters / 1e9:.3g} B parameters ({shape.parameters:,}), "
          f"{shape.layers} layers x hidden {shape.hidden}, {shape.tokens_per_sample} tokens/sample")
    print(f"strategy: {strategy.config.describe()} on {strategy.world_size} GPU(s), optimizer {strategy.optimizer.value}"
          + (", calibrated from the profile" if calibration is not None else ""))
    print("sources: " + ", ".join(f"{term} {source}" for term, source in sources.items()))
    if profile is not None and profile.optimizer and profile.optimizer != strategy.optimizer.value:
        print(f"note: the profile ran {profile.optimizer}, the job trains with {strategy.optimizer.value}: its "
              f"measured step residual is not used (profile with --optimizer {strategy.optimizer.value})")
    usable = None
    if gpu is not None:
        pool = catalog_pools(CATALOG, gpus_per_node=strategy.gpus_per_node)
        offer = resolve_offer(next(p for p in pool if p.metadata.name == gpu.key), catalog=CATALOG)
        usable = gpu.usable_bytes
        if not isinstance(offer, PoolRejection):
            step = estimate_step_seconds(hot, strategy, offer.speed)
            print(f"on {gpu.product}: step {step.step_seconds:.3f} s (compute {step.compute_seconds:.3f}, "
                  f"communication {step.communication_seconds:.3f}, offload {step.offload_seconds:.3f})")
    print(f"peak at the {memory.phase} phase (predicted):")
    print(breakdown_table(memory, usable_bytes=usable))
    return 0


def register(subparsers: Any) -> None:
    """Register `memfit estimate` (sets `func`)."""
    e = subparsers.add_parser("estimate", help="per-GPU memory breakdown of one configuration",
                              description=cmd_estimate.__doc__)
    source = e.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", help="MemoryOptimizedTrainingJob YAML (its pinned strategy fields apply)")
    source.add_argument("--hf-config", help="Hugging Face config.json (nothing is downloaded)")
    source.add_argument("--builtin", help="e.g. gpt:layers=24,hidden=2048,heads=16,vocab=32000,seq=2048")
    e.add_argument("--seq", type=int, default=2048, help="tokens per sample for --hf-config (default 2048)")
    e.add_argument("--attention", choices=[a.value for a in Attention], default="auto",
                   help="--hf-config: attention implementation (eager materialises the scores; auto = sdpa)")
    e.add_argument("--task", choices=[t.value for t in Task], default="auto",
                   help="--hf-config: the head trained (sequence-classification replaces the LM head)")
    e.add_argument("--engine", choices=[x.value for x in (Engine.DDP, Engine.FSDP, Engine.DEEPSPEED)])
    e.add_argument("--stage", type=int, choices=[0, 1, 2, 3], help="ZeRO stage (FSDP: 2 or 3)")
    e.add_argument("--world-size", type=int, default=1)
    e.add_argument("--gpus-per-node", type=int)
    e.add_argument("--precision", choices=["fp32", "bf16", "fp16", "bf16-pure"],
                   help="bf16-pure: bf16 weights, gradients and optimizer state, no fp32 master copy")
    e.add_argument("--checkpointing", choices=["none", "selective", "selective-op", "full"],
                   help="selective-op: every block recomputed but its matmul and attention outputs kept")
    e.add_argument("--offload", choices=["none", "cpu", "nvme"])
    e.add_argument("--optimizer8bit", action="store_true", help="bitsandbytes 8-bit optimizer state")
    e.add_argument("--optimizer-in-backward", action="store_true",
                   help="each parameter steps in backward, no gradient kept (DDP, one GPU, no accumulation)")
    e.add_argument("--chunked-loss", action="store_true",
                   help="head and cross-entropy over chunks of tokens: never the full fp32 logits")
    e.add_argument("--activation-offload", action="store_true",
                   help="each block's saved activations in host memory between forward and backward")
    e.add_argument("--optimizer-implementation", choices=["fused", "foreach", "for-loop"],
                   help="how the 32-bit optimizer steps: fused kernels (no temporaries), foreach (one fp32 "
                        "temporary of the parameters), a per-tensor loop; default: torch's for the device")
    e.add_argument("--optimizer", choices=[k.value for k in OptimizerKind])
    e.add_argument("--micro-batch", type=int)
    e.add_argument("--accumulation", type=int)
    e.add_argument("--profile", help="Profile JSON to calibrate with")
    e.add_argument("--peft", choices=["none", "lora", "qlora"], help="LoRA (16-bit base) or QLoRA (4-bit base)")
    e.add_argument("--lora-rank", type=int, help="adapter rank (default 16)")
    e.add_argument("--lora-targets", help="comma-separated target modules (default: every block linear layer)")
    e.add_argument("--gpu", help="catalog GPU key: also print usable memory and step time")
    e.add_argument("--device", choices=[d.value for d in Device], default=Device.CUDA.value,
                   help="where the step runs (cpu: the CPU optimizer kernels, as the CPU profiler measures)")
    e.add_argument("--json", action="store_true", help="print the MemoryBreakdown as JSON")
    e.set_defaults(func=cmd_estimate)

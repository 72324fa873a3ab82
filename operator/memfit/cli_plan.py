"""`memfit plan` and `memfit estimate`: the planner and the memory model from the command line.

`add_plan_commands(subparsers)` registers both on the main `memfit` parser; each handler returns the
exit code: 0 done, 1 nothing fits (the reasons are printed), 2 invalid input (field paths, no
traceback). Files are read here; everything else is the pure planner and memory model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from memfit.api import rules
from memfit.api.common import Checkpointing, Engine, Offload, Precision, Toggle
from memfit.api.job import MemoryOptimizedTrainingJob, OptimizerKind, StrategySpec
from memfit.api.pool import GPUNodePool
from memfit.api.problem import BuiltinProblem, HuggingFaceProblem
from memfit.api.profile import ModelShape, Profile
from memfit.api.validation import Violation, load_file, violations_from
from memfit.catalog import CATALOG, find_gpu
from memfit.memory import (
    Calibration,
    Device,
    MemoryEstimate,
    Shape,
    ShapeError,
    Strategy,
    calibrate,
    estimate_step_seconds,
    predict_memory,
    shape_from_problem,
    strategy_problem,
)
from memfit.planner import Candidate, PlanResult, PoolRejection, catalog_pools, plan
from memfit.planner.offers import resolve_offer

GIB = 1024**3
DEFAULT_STAGE = {Engine.DDP: 0, Engine.FSDP: 3, Engine.DEEPSPEED: 2}


class InputError(Exception):
    """Invalid input: printed as `error: ...` lines, exit code 2."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


# ----------------------------------------------------------------------------------------- loading


# Pinned strategy combinations that cannot run. `memfit validate` and admission reject them; `memfit
# plan` answers them as the planner does (NoFit with the reason, exit 1), as issue 4 asks.
PIN_RULES = (rules.ddp_does_not_shard, rules.ddp_does_not_offload, rules.nvme_needs_deepspeed)


def _job_with_impossible_pins(path: Path, problems: Sequence[Violation]) -> MemoryOptimizedTrainingJob | None:
    """The job when its only problems are impossible pin combinations (else None)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(d, dict)]
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    doc = next((d for d in docs if d.get("kind") == "MemoryOptimizedTrainingJob"), None)
    spec = doc.get("spec") if doc is not None else None
    if doc is None or not isinstance(spec, dict) or not isinstance(spec.get("strategy"), dict):
        return None
    pins = {finding for rule in PIN_RULES if (finding := rule(spec)) is not None}
    if not pins or any((p.path, p.message) not in pins for p in problems):
        return None
    try:
        strategy = StrategySpec.model_validate(spec["strategy"])
        rest = {**doc, "spec": {k: v for k, v in spec.items() if k != "strategy"}}
        job = MemoryOptimizedTrainingJob.model_validate(rest)
    except ValidationError:
        return None
    return job.model_copy(update={"spec": job.spec.model_copy(update={"strategy": strategy})})


def _load_job(path: Path, *, allow_impossible_pins: bool = False) -> MemoryOptimizedTrainingJob:
    loaded, problems = load_file(path)
    if problems:
        job = _job_with_impossible_pins(path, problems) if allow_impossible_pins else None
        if job is not None:
            return job
        raise InputError([str(p) for p in problems])
    jobs = [item.obj for item in loaded if isinstance(item.obj, MemoryOptimizedTrainingJob)]
    if not jobs:
        raise InputError([f"{path}: no MemoryOptimizedTrainingJob in the file"])
    return jobs[0]


def _load_pools(path: Path) -> tuple[list[GPUNodePool], list[PoolRejection]]:
    """Valid pools, and invalid pool documents turned into rejections (so planning goes on)."""
    loaded, problems = load_file(path)
    unreadable = [p for p in problems if p.path == "" and ("cannot read" in p.message or "YAML" in p.message)]
    if unreadable:
        raise InputError([str(p) for p in unreadable])
    pools = [item.obj for item in loaded if isinstance(item.obj, GPUNodePool)]
    rejected = [PoolRejection(_pool_name(p.source), f"invalid ({p.source}): {p.path}: {p.message}")
                for p in problems]
    if not pools and not rejected:
        raise InputError([f"{path}: no GPUNodePool in the file"])
    return pools, rejected


def _pool_name(source: str) -> str:
    """`pools.yaml[2] (l4-spot)` -> `l4-spot` (the source when the document has no name)."""
    if source.endswith(")") and " (" in source:
        return source.rsplit(" (", 1)[1][:-1]
    return source


def _load_profile(path: Path) -> Profile:
    try:
        return Profile.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InputError([f"{path}: cannot read: {error}"]) from None
    except ValidationError as error:
        raise InputError([str(v) for v in violations_from(error, str(path))]) from None


# ----------------------------------------------------------------------------------------- printing


def _g(n: float) -> str:
    return f"{n / GIB:.1f}"


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _money(x: float) -> str:
    return f"${x:.2f}" if x >= 0.01 or x == 0 else f"${x:.2g}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "  ") -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    right = [i > 0 and all(_numeric(r[i]) for r in rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return (indent + "  ".join(out)).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _numeric(text: str) -> bool:
    return bool(text) and text.lstrip("$-+").replace(".", "", 1).replace(",", "").rstrip("%").isdigit()


def breakdown_table(memory: MemoryEstimate, *, usable_bytes: int | None = None) -> str:
    """The per-GPU memory breakdown as a two-column table (GiB and bytes)."""
    rows = [
        ("parameters", memory.parameters_bytes),
        ("gradients", memory.gradients_bytes),
        ("optimizer state", memory.optimizer_bytes),
        ("activations", memory.activations_bytes),
        ("temporaries", memory.temporaries_bytes),
        ("framework overhead", memory.overhead_bytes),
        ("peak per GPU", memory.peak_bytes),
    ]
    if usable_bytes is not None:
        rows.append(("usable on the GPU", usable_bytes))
    rows += [("host RAM per GPU (offload)", memory.host_bytes), ("NVMe per GPU (offload)", memory.nvme_bytes)]
    return _table(["component", "size", "bytes"], [(n, _size(v), f"{v:,}") for n, v in rows])


def _candidate_row(index: str, c: Candidate) -> list[str]:
    s = c.strategy
    return [
        index, c.pool, f"{c.nodes}x{s.gpus_per_node}", c.product, s.describe(),
        f"{_g(c.memory.peak_bytes)}/{_g(c.usable_bytes)}", _money(c.price_per_hour),
        f"{c.step.step_seconds:.3g}", f"{c.hours:.3g}", _money(c.total_cost),
    ]


def render_result(result: PlanResult, *, title: str) -> str:
    """The human-readable `memfit plan` report."""
    out = [title]
    headers = ["#", "pool", "nodes x GPUs", "GPU", "configuration", "peak/usable GiB", "$/h",
               "step s", "hours", "total $"]
    if result.chosen is not None:
        c = result.chosen
        out += ["", "Plan (predicted):", _table(headers, [_candidate_row("1", c)]), ""]
        out += [f"  memory per GPU at the peak ({c.memory.phase}), {c.headroom_percent}% headroom kept:",
                breakdown_table(c.memory, usable_bytes=c.usable_bytes)]
        if result.alternatives:
            rows = [_candidate_row(str(i), a) for i, a in enumerate(result.alternatives, start=2)]
            out += ["", "Alternatives (best on each other pool):", _table(headers, rows)]
    else:
        out += ["", "NoFit: nothing fits."]
        out += [f"  - {reason}" for reason in result.reasons]
    if result.rejections:
        out += ["", "Rejected pools:"] + [f"  - {r.pool}: {r.reason}" for r in result.rejections]
    b = result.baseline
    if b is not None:
        fits = "fits" if b.fits else "does NOT fit"
        out += ["", f"Baseline: {b.label}, micro-batch {b.micro_batch_size}: {fits} "
                    f"(peak {_g(b.peak_bytes)}/{_g(b.usable_bytes)} GiB), {_money(b.price_per_hour)}/h, "
                    f"{b.hours:.3g} h, {_money(b.total_cost)}"]
        if b.note:
            out.append(f"  note: {b.note}")
        if result.savings_percent is not None:
            out.append(f"Savings vs baseline: {result.savings_percent:.1f}% of the total cost (predicted)")
    if result.notes:
        out += ["", "Notes:"] + [f"  - {n}" for n in result.notes]
    return "\n".join(out)


def _title(job: MemoryOptimizedTrainingJob, shape: ModelShape | None, source: str) -> str:
    spec = job.spec
    what = f"memfit plan: {job.metadata.name}"
    if shape is not None:
        what += (f" ({shape.parameters / 1e9:.3g} B parameters, {shape.tokens_per_sample} tokens/sample, "
                 f"shape {source})")
    t = spec.training
    return (f"{what}\n  global batch {t.global_batch_size} x {t.max_steps} steps, optimizer {t.optimizer.value}, "
            f"objective {spec.objective.minimize.value}, headroom {spec.objective.memory_headroom_percent}%")


def draw_chart(result: PlanResult, path: Path) -> None:
    """Stacked bars of each candidate's memory breakdown against its GPU's usable memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    candidates = [c for c in (result.chosen, *result.alternatives) if c is not None]
    parts = [("parameters", "parameters_bytes"), ("gradients", "gradients_bytes"),
             ("optimizer", "optimizer_bytes"), ("activations", "activations_bytes"),
             ("temporaries", "temporaries_bytes"), ("overhead", "overhead_bytes")]
    labels = [f"{c.pool}\n{c.gpus}x {c.strategy.precision.value}" for c in candidates]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(candidates) + 2), 5))
    bottoms = [0.0] * len(candidates)
    for name, attr in parts:
        values = [getattr(c.memory, attr) / GIB for c in candidates]
        ax.bar(labels, values, bottom=bottoms, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for i, c in enumerate(candidates):
        usable = c.usable_bytes / GIB
        ax.hlines(usable, i - 0.45, i + 0.45, colors="black", linestyles="dashed")
        ax.hlines(usable / (1 + c.headroom_percent / 100), i - 0.45, i + 0.45, colors="grey", linestyles="dotted")
    ax.set_ylabel("GiB per GPU (dashed: usable, dotted: usable less headroom)")
    ax.set_title("memfit plan: predicted per-GPU memory of the plan and alternatives")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    """`memfit plan JOB.yaml [--pools P.yaml] [--profile P.json] [--json] [--chart OUT.png]`."""
    try:
        job = _load_job(Path(args.job), allow_impossible_pins=True)
        pools, invalid = _load_pools(Path(args.pools)) if args.pools else (catalog_pools(), [])
        profile = _load_profile(Path(args.profile)) if args.profile else None
    except InputError as error:
        for line in error.lines:
            print(f"error: {line}", file=sys.stderr)
        return 2
    result = plan(job.spec, pools=pools, profile=profile)
    if invalid:
        result = PlanResult(
            result.plan, result.chosen, result.alternatives, (*invalid, *result.rejections),
            result.baseline, result.savings_percent, result.reasons, result.notes,
        )
    if args.json:
        if result.plan is not None:
            print(json.dumps(result.plan.to_wire(), indent=2))
        else:
            print(json.dumps({"noFit": True, "reasons": result.no_fit_reasons()}, indent=2))
    else:
        shape = profile.shape if profile is not None and profile.shape is not None else None
        source = "from the profile"
        if shape is None:
            try:
                shape, source = shape_from_problem(job.spec.problem), "analytic"
            except ShapeError:
                shape = None
        print(render_result(result, title=_title(job, shape, source)))
    if args.chart and result.chosen is not None:
        draw_chart(result, Path(args.chart))
        if not args.json:
            print(f"\nChart: {args.chart}")
    if result.plan is None:
        for reason in result.no_fit_reasons():
            print(f"nofit: {reason}", file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------------------- estimate


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
    """The analytic shape of the job's problem; None for user code when a profile will give it."""
    if args.job:
        job = _load_job(Path(args.job))
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
            spec = HuggingFaceProblem(model="local/config", config=config, sequence_length=args.seq)
            return shape_from_problem(spec), None
        except ValidationError as error:
            raise InputError([str(v) for v in violations_from(error, str(path))]) from None
        except ShapeError as error:
            raise InputError([f"{path}: {error}"]) from None
    try:
        return shape_from_problem(parse_builtin(args.builtin)), None
    except ShapeError as error:
        raise InputError([f"--builtin: {error}"]) from None


def _pick(value: str | None, pinned: object, auto: object, default: Any, kind: Any) -> Any:
    if value is not None:
        return kind(value)
    return default if pinned == auto else pinned


def _estimate_strategy(args: argparse.Namespace, job: MemoryOptimizedTrainingJob | None) -> Strategy:
    pins = job.spec.strategy if job is not None else None
    engine = _pick(args.engine, pins.engine if pins else Engine.AUTO, Engine.AUTO, Engine.DDP, Engine)
    stage_pin = pins.zero_stage if pins else "auto"
    stage = args.stage if args.stage is not None else (stage_pin if stage_pin != "auto" else DEFAULT_STAGE[engine])
    optimizer = OptimizerKind(args.optimizer) if args.optimizer else (
        job.spec.training.optimizer if job else OptimizerKind.ADAMW
    )
    eight = args.optimizer8bit or (pins is not None and pins.optimizer8bit == Toggle.ENABLED)
    mbs_pin = pins.micro_batch_size if pins else "auto"
    micro = args.micro_batch or (mbs_pin if isinstance(mbs_pin, int) else 1)
    world = args.world_size
    accumulation = args.accumulation
    if accumulation is None:
        accumulation = max(1, job.spec.training.global_batch_size // (world * micro)) if job else 1
    return Strategy(
        engine=engine,
        zero_stage=int(stage),
        precision=_pick(args.precision, pins.precision if pins else Precision.AUTO, Precision.AUTO,
                        Precision.BF16, Precision),
        checkpointing=_pick(args.checkpointing, pins.activation_checkpointing if pins else Checkpointing.AUTO,
                            Checkpointing.AUTO, Checkpointing.NONE, Checkpointing),
        offload=_pick(args.offload, pins.offload if pins else Offload.AUTO, Offload.AUTO, Offload.NONE, Offload),
        optimizer8bit=eight,
        optimizer=optimizer,
        world_size=world,
        gpus_per_node=args.gpus_per_node or min(world, 8),
        micro_batch_size=micro,
        accumulation_steps=accumulation,
        device=Device(args.device),
    )


def cmd_estimate(args: argparse.Namespace) -> int:
    """`memfit estimate (--job J | --hf-config C [--seq N] | --builtin SPEC) [strategy options]`."""
    try:
        shape, job = _estimate_shape(args)
        strategy = _estimate_strategy(args, job)
        problem = strategy_problem(strategy)
        if problem is not None:
            raise InputError([f"strategy: {problem}"])
        profile = _load_profile(Path(args.profile)) if args.profile else None
        gpu = find_gpu(args.gpu) if args.gpu else None
        if args.gpu and gpu is None:
            raise InputError([f"--gpu: {args.gpu!r} is not in the catalog ({', '.join(g.key for g in CATALOG)})"])
    except InputError as error:
        for line in error.lines:
            print(f"error: {line}", file=sys.stderr)
        return 2
    if profile is not None and profile.shape is not None:
        shape = profile.shape
    if shape is None:
        print(f"error: {args.profile}: the profile has no model shape"
              + (f" (profiling failed: {profile.error})" if profile is not None and profile.error else ""),
              file=sys.stderr)
        return 2
    hot = Shape.of(shape)
    calibration: Calibration | None = None
    if profile is not None and (profile.measurements or profile.activation_curves):
        calibration = calibrate(profile, hot)  # with the optimizer the profile ran
    memory = predict_memory(hot, strategy, calibration=calibration)
    sources = calibration.sources(strategy) if calibration is not None else {
        "parameters": "analytic", "optimizer": "analytic", "activations": "analytic", "step": "analytic",
        "fragmentation": "analytic"}
    if args.json:
        print(json.dumps({**memory.to_breakdown().to_wire(), "sources": sources}, indent=2))
        return 0
    print(f"memfit estimate: {shape.parameters / 1e9:.3g} B parameters ({shape.parameters:,}), "
          f"{shape.layers} layers x hidden {shape.hidden}, {shape.tokens_per_sample} tokens/sample")
    print(f"strategy: {strategy.describe()} on {strategy.world_size} GPU(s), optimizer {strategy.optimizer.value}"
          + (", calibrated from the profile" if calibration is not None else ""))
    print("sources: " + ", ".join(f"{term} {source}" for term, source in sources.items()))
    if profile is not None and profile.optimizer and profile.optimizer != strategy.optimizer.value:
        print(f"note: the profile ran {profile.optimizer}, the job trains with {strategy.optimizer.value}: "
              "the step's measured residual is not used; profile with --optimizer "
              f"{strategy.optimizer.value}")
    usable = None
    if gpu is not None:
        pool = catalog_pools(gpus_per_node=strategy.gpus_per_node)
        offer = resolve_offer(next(p for p in pool if p.metadata.name == gpu.key))
        usable = gpu.usable_bytes
        if not isinstance(offer, PoolRejection):
            step = estimate_step_seconds(hot, strategy, offer.speed)
            print(f"on {gpu.product}: step {step.step_seconds:.3f} s (compute {step.compute_seconds:.3f}, "
                  f"communication {step.communication_seconds:.3f}, offload {step.offload_seconds:.3f})")
    print(f"peak at the {memory.phase} phase (predicted):")
    print(breakdown_table(memory, usable_bytes=usable))
    return 0


# ----------------------------------------------------------------------------------------- wiring


def add_plan_commands(subparsers: Any) -> None:
    """Register `plan` and `estimate` on the `memfit` parser's subparsers (each sets `func`)."""
    p = subparsers.add_parser("plan", help="choose the cheapest configuration and pool that fits (offline)",
                              description=cmd_plan.__doc__)
    p.add_argument("job", help="MemoryOptimizedTrainingJob YAML")
    p.add_argument("--pools", help="GPUNodePool YAML (default: one 8-GPU pool per catalog GPU)")
    p.add_argument("--profile", help="Profile JSON from `memfit-trainer profile`")
    p.add_argument("--json", action="store_true", help="print the Plan as JSON")
    p.add_argument("--chart", help="write a PNG of each candidate's memory breakdown")
    p.set_defaults(func=cmd_plan)

    e = subparsers.add_parser("estimate", help="per-GPU memory breakdown of one configuration",
                              description=cmd_estimate.__doc__)
    source = e.add_mutually_exclusive_group(required=True)
    source.add_argument("--job", help="MemoryOptimizedTrainingJob YAML (its pinned strategy fields apply)")
    source.add_argument("--hf-config", help="Hugging Face config.json (nothing is downloaded)")
    source.add_argument("--builtin", help="e.g. gpt:layers=24,hidden=2048,heads=16,vocab=32000,seq=2048")
    e.add_argument("--seq", type=int, default=2048, help="tokens per sample for --hf-config (default 2048)")
    e.add_argument("--engine", choices=[x.value for x in (Engine.DDP, Engine.FSDP, Engine.DEEPSPEED)])
    e.add_argument("--stage", type=int, choices=[0, 1, 2, 3], help="ZeRO stage (FSDP: 2 or 3)")
    e.add_argument("--world-size", type=int, default=1)
    e.add_argument("--gpus-per-node", type=int)
    e.add_argument("--precision", choices=["fp32", "bf16", "fp16"])
    e.add_argument("--checkpointing", choices=["none", "selective", "full"])
    e.add_argument("--offload", choices=["none", "cpu", "nvme"])
    e.add_argument("--optimizer8bit", action="store_true", help="bitsandbytes 8-bit optimizer state")
    e.add_argument("--optimizer", choices=[k.value for k in OptimizerKind])
    e.add_argument("--micro-batch", type=int)
    e.add_argument("--accumulation", type=int)
    e.add_argument("--profile", help="Profile JSON to calibrate with")
    e.add_argument("--gpu", help="catalog GPU key: also print usable memory and step time")
    e.add_argument("--device", choices=[d.value for d in Device], default=Device.CUDA.value,
                   help="where the step runs (cpu: the CPU optimizer kernels, as the CPU profiler measures)")
    e.add_argument("--json", action="store_true", help="print the MemoryBreakdown as JSON")
    e.set_defaults(func=cmd_estimate)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (`python -m memfit.cli_plan plan ...`); `memfit` wires the same commands."""
    parser = argparse.ArgumentParser(prog="memfit")
    add_plan_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

"""Printing plans and memory breakdowns: tables, the `memfit plan` report and its PNG chart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from memfit.api.job import MemoryOptimizedTrainingJob
from memfit.api.plan import savings_text
from memfit.api.profile import ModelShape
from memfit.memory import MemoryEstimate
from memfit.planner import Candidate, PlanResult
from memfit.planner.result import wall_clock_text

GIB = 1024**3


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
        # The peak at the three levels a user can compare with what they see on the GPU.
        ("  allocated (max_memory_allocated)", memory.allocated_bytes),
        ("  reserved (max_memory_reserved)", memory.reserved_bytes),
        ("  device used (nvidia-smi)", memory.peak_bytes),
    ]
    if usable_bytes is not None:
        rows.append(("usable on the GPU", usable_bytes))
    rows += [("host RAM per GPU (offload)", memory.host_bytes), ("NVMe per GPU (offload)", memory.nvme_bytes)]
    return _table(["component", "size", "bytes"], [(n, _size(v), f"{v:,}") for n, v in rows])


def _candidate_row(index: str, c: Candidate) -> list[str]:
    s = c.strategy
    return [
        index, c.pool, f"{c.nodes}x{s.gpus_per_node}", c.product, s.config.describe(),
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
        out += peft_lines(result)
        if result.plan is not None and result.plan.cost_notes:
            out += ["", "Why this cost:"] + [f"  - {n}" for n in result.plan.cost_notes]
        if result.alternatives:
            rows = [_candidate_row(str(i), a) for i, a in enumerate(result.alternatives, start=2)]
            out += ["", "Alternatives (best on each other pool):", _table(headers, rows)]
    else:
        out += ["", "NoFit: nothing fits."]
        out += [f"  - {reason}" for reason in result.reasons]
    if result.rejections:
        out += ["", "Rejected pools:"] + [f"  - {r.pool}: {r.reason}" for r in result.rejections]
    if result.baseline is None:
        out += ["", "Baseline: no setup a practitioner would try (plain DDP up to FSDP with CPU offload) fits an "
                    "allowed pool"]
    for b, savings in ((result.baseline, result.savings_percent),
                       (result.declared_baseline, result.declared_savings_percent)):
        if b is None:
            continue
        fits = "fits" if b.fits else "does NOT fit"
        out += ["", f"Baseline: {b.label}, micro-batch {b.micro_batch_size}: {fits} "
                    f"(peak {_g(b.peak_bytes)}/{_g(b.usable_bytes)} GiB), {_money(b.price_per_hour)}/h, "
                    f"{b.hours:.3g} h, {_money(b.total_cost)}"]
        if b.note:
            out.append(f"  note: {b.note}")
        if savings is not None:
            out.append(f"  memfit vs this baseline: {savings_text(savings)} of the total cost, "
                       f"{wall_clock_text(result.plan.estimated_hours if result.plan else 0.0, b.hours)} (predicted)")
        for step in b.escalation:
            out.append(f"  tried: {step}")
    if result.notes:
        out += ["", "Notes:"] + [f"  - {n}" for n in result.notes]
    return "\n".join(out)


def _less(ours: float, theirs: float) -> str:
    """`33% less` / `12% more` (savings read as savings, never as a negative number)."""
    if theirs <= 0:
        return "n/a"
    change = 100 * (1 - ours / theirs)
    return f"{change:.0f}% less" if change >= 0 else f"{-change:.0f}% more"


def peft_lines(result: PlanResult) -> list[str]:
    """For a LoRA/QLoRA plan: the adapters, the trainable fraction and the difference against the
    best full fine-tune (memory per GPU and total cost)."""
    plan, c = result.plan, result.chosen
    if plan is None or c is None or plan.adapter is None:
        return []
    a = plan.adapter
    method = "QLoRA" if plan.peft.value == "qlora" else "LoRA"
    quant = f", {a.quant_type.value}{' double-quant' if a.double_quant else ''} base" if method == "QLoRA" else ""
    out = ["", f"{method}: rank {a.rank}, alpha {a.alpha}, dropout {a.dropout:g}, targets "
               f"{', '.join(a.target_modules)}{quant}"]
    fraction = plan.trainable_fraction
    if fraction is not None and plan.trainable_parameters is not None:
        out.append(f"  trainable: {plan.trainable_parameters:,} of {plan.parameters:,} parameters "
                   f"({100 * fraction:.3g}%)")
    full = plan.full_finetune
    if full is not None and full.peak_bytes is not None and full.estimated_cost is not None:
        out.append(f"  vs the best full fine-tune ({full.description}): peak {_g(c.memory.peak_bytes)} vs "
                   f"{_g(full.peak_bytes)} GiB per GPU ({_less(c.memory.peak_bytes, full.peak_bytes)}), "
                   f"{_money(c.total_cost)} vs {_money(full.estimated_cost)} "
                   f"({_less(c.total_cost, full.estimated_cost)})")
    elif full is not None:
        out.append(f"  vs a full fine-tune: {full.description}")
    return out


def plan_title(job: MemoryOptimizedTrainingJob, shape: ModelShape | None, source: str) -> str:
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
    labels = [f"{c.pool}\n{c.gpus}x {c.strategy.config.precision.value}" for c in candidates]
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


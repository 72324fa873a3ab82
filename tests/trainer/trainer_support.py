"""Factories and launchers for the trainer tests: plans, in-process runs, CLI and torchrun subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TORCH_EXTENSIONS_DIR = os.environ.get(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "memfit" / "torch_extensions")
)
TINY_GPT = {"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "sequenceLength": 32}


@dataclass(frozen=True)
class PlanBuilder:
    """Fluent Plan factory: `make_plan().deepspeed(3).bf16().ckpt("full").offload("cpu").world(2).build()`."""

    fields: dict[str, Any] = field(default_factory=dict)

    def _with(self, **values: Any) -> PlanBuilder:
        return replace(self, fields={**self.fields, **values})

    def ddp(self) -> PlanBuilder:
        return self._with(engine="ddp", zeroStage=0)

    def fsdp(self, stage: int = 3) -> PlanBuilder:
        return self._with(engine="fsdp", zeroStage=stage)

    def deepspeed(self, stage: int) -> PlanBuilder:
        return self._with(engine="deepspeed", zeroStage=stage)

    def engine(self, name: str, stage: int) -> PlanBuilder:
        return self._with(engine=name, zeroStage=stage)

    def precision(self, value: str) -> PlanBuilder:
        return self._with(precision=value)

    def bf16(self) -> PlanBuilder:
        return self.precision("bf16")

    def ckpt(self, mode: str) -> PlanBuilder:
        return self._with(activationCheckpointing=mode)

    def offload(self, where: str, nvme_path: str | None = None) -> PlanBuilder:
        return self._with(offload=where, **({"nvmePath": nvme_path} if nvme_path else {}))

    def eight_bit(self, enabled: bool = True) -> PlanBuilder:
        return self._with(optimizer8bit=enabled)

    def in_backward(self, enabled: bool = True) -> PlanBuilder:
        """plan.optimizerInBackward: each parameter steps in its post-accumulate-grad hook."""
        return self._with(optimizerInBackward=enabled)

    def chunked_loss(self, enabled: bool = True) -> PlanBuilder:
        """plan.chunkedLoss: the LM head and cross-entropy over chunks of tokens."""
        return self._with(chunkedLoss=enabled)

    def activation_offload(self, enabled: bool = True) -> PlanBuilder:
        """plan.activationOffload: each block's saved tensors in host memory between forward and backward."""
        return self._with(activationOffload=enabled)

    def optimizer(self, kind: str) -> PlanBuilder:
        return self._with(optimizer=kind)

    def implementation(self, name: str) -> PlanBuilder:
        """plan.optimizerImplementation: fused, foreach or for-loop."""
        return self._with(optimizerImplementation=name)

    def world(self, gpus: int, nodes: int = 1) -> PlanBuilder:
        return self._with(gpusPerNode=gpus, nodes=nodes)

    def batch(self, micro: int, accumulation: int) -> PlanBuilder:
        return self._with(microBatchSize=micro, gradientAccumulationSteps=accumulation)

    def steps(self, max_steps: int, every: int = 1000) -> PlanBuilder:
        return self._with(maxSteps=max_steps, everySteps=every)

    def planned_every(self, steps: int, *, pinned: int | None = None) -> PlanBuilder:
        """The interval memfit chose (plan.checkpointEverySteps), beside the job's pin or none."""
        return self._with(checkpointEverySteps=steps, everySteps=pinned)

    def checkpoint_dir(self, path: Path | str) -> PlanBuilder:
        return self._with(checkpointDir=str(path))

    def problem(self, problem: dict[str, Any]) -> PlanBuilder:
        return self._with(problemSpec=problem)

    def learning_rate(self, lr: float) -> PlanBuilder:
        return self._with(learningRate=lr)

    def global_batch(self, samples: int) -> PlanBuilder:
        return self._with(globalBatchSize=samples)

    def peft(self, method: str, *, rank: int = 8, targets: tuple[str, ...] = ("qkv", "proj", "fc", "out"),
             dropout: float = 0.0) -> PlanBuilder:
        """LoRA/QLoRA with adapters of `rank` on `targets` (alpha 2r)."""
        adapter = {"rank": rank, "alpha": 2 * rank, "dropout": dropout, "targetModules": list(targets)}
        return self._with(peft=method, adapter=adapter)

    def data(self, data: dict[str, Any]) -> PlanBuilder:
        """spec.data carried by the plan (wire form)."""
        return self._with(data=data)

    def wire(self) -> dict[str, Any]:
        f = {
            "engine": "ddp",
            "zeroStage": 0,
            "precision": "fp32",
            "activationCheckpointing": "none",
            "offload": "none",
            "optimizer8bit": False,
            "microBatchSize": 2,
            "gradientAccumulationSteps": 2,
            "nodes": 1,
            "gpusPerNode": 1,
            "maxSteps": 6,
            "everySteps": 1000,
            "optimizer": "adamw",
            "learningRate": 3e-3,
            **self.fields,
        }
        world = f["nodes"] * f["gpusPerNode"]
        training = {
            "globalBatchSize": f.get(
                "globalBatchSize", f["microBatchSize"] * f["gradientAccumulationSteps"] * world
            ),
            "maxSteps": f["maxSteps"],
            "optimizer": f["optimizer"],
            "learningRate": f["learningRate"],
            "checkpoint": {} if f["everySteps"] is None else {"everySteps": f["everySteps"]},
        }
        plan = {
            key: f[key]
            for key in (
                "engine", "zeroStage", "precision", "activationCheckpointing", "offload", "optimizer8bit",
                "microBatchSize", "gradientAccumulationSteps", "nodes", "gpusPerNode",
            )
        }  # fmt: skip
        plan |= {
            "nodePool": "local-cpu",
            "gpuProduct": "cpu",
            "gpuMemoryBytes": 0,
            "memory": {
                "parametersBytes": 0, "gradientsBytes": 0, "optimizerBytes": 0, "activationsBytes": 0,
                "temporariesBytes": 0, "overheadBytes": 0, "peakBytes": 0,
            },
            "headroomPercent": 10,
            "pricePerHour": 0,
            "stepSeconds": 0,
            "estimatedHours": 0,
            "estimatedCost": 0,
            "problem": f.get("problemSpec", {"builtin": TINY_GPT}),
            "training": training,
        }  # fmt: skip
        for optional in ("checkpointDir", "nvmePath", "peft", "adapter", "data", "checkpointEverySteps",
                         "optimizerInBackward", "chunkedLoss", "optimizerImplementation", "activationOffload"):
            if optional in f:
                plan[optional] = f[optional]
        return plan

    def build(self) -> Any:
        from memfit.api.plan import Plan

        return Plan.model_validate(self.wire())

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.wire()), encoding="utf-8")
        return path


def make_plan() -> PlanBuilder:
    """A tiny-GPT plan: DDP, fp32, no checkpointing, micro-batch 2 x 2, 6 steps, one rank."""
    return PlanBuilder()


def case_id(plan: PlanBuilder) -> str:
    """Readable id: `deepspeed3-bf16-full-cpu-8bit-w2`."""
    w = plan.wire()
    parts = [f"{w['engine']}{w['zeroStage']}", w["precision"], w["activationCheckpointing"], w["offload"]]
    if w["optimizer8bit"]:
        parts.append("8bit")
    if w["training"]["optimizer"] != "adamw":
        parts.append(w["training"]["optimizer"])
    parts.append(f"w{w['nodes'] * w['gpusPerNode']}")
    return "-".join(parts)


def subprocess_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment for a trainer subprocess: one thread per rank, cached DeepSpeed ops, local paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMFIT_", "PET_", "RANK", "LOCAL_RANK"))}
    for key in (
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "JOB_COMPLETION_INDEX",
    ):
        env.pop(key, None)
    env |= {
        "OMP_NUM_THREADS": "1",
        "TORCH_EXTENSIONS_DIR": TORCH_EXTENSIONS_DIR,
        "MEMFIT_TERMINATION_MESSAGE_PATH": str(tmp / "termination-log"),
        "PYTHONUNBUFFERED": "1",
    }
    return env | extra


@dataclass(frozen=True)
class CliRun:
    """What a `memfit-trainer train` subprocess left behind."""

    returncode: int
    output: str
    termination: dict[str, Any] | None
    reports: dict[int, dict[str, Any]]


def run_cli(
    plan: PlanBuilder, tmp: Path, *, env: dict[str, str] | None = None, timeout_s: float = 600
) -> CliRun:
    """`python -m memfit_trainer.cli train --plan … --report-dir …` (it starts torchrun itself for world > 1)."""
    plan_path = plan.write(tmp / "plan.json")
    report_dir = tmp / "reports"
    environ = subprocess_env(tmp, **(env or {}))
    termination = tmp / "termination-log"
    termination.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "memfit_trainer.cli",
            "train",
            "--plan",
            str(plan_path),
            "--report-dir",
            str(report_dir),
        ],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    message = (
        json.loads(termination.read_text()) if termination.exists() and termination.read_text() else None
    )
    reports = {
        int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in sorted(report_dir.glob("rank-*.json"))
    } if report_dir.exists() else {}  # fmt: skip
    for p in report_dir.glob("rank-*.json") if report_dir.exists() else []:
        p.unlink()
    return CliRun(proc.returncode, proc.stdout + proc.stderr, message, reports)


def losses(report: dict[str, Any]) -> list[float]:
    """The per-step losses of a run report."""
    return [loss for _, loss in report["losses"]]


# The strategy space the runtime accepts on CPU (plan_check): engine, stage and offload together.
ENGINE_STAGE_OFFLOAD: list[tuple[str, int, str]] = [
    ("ddp", 0, "none"),
    ("fsdp", 2, "none"),
    ("fsdp", 2, "cpu"),
    ("fsdp", 3, "none"),
    ("fsdp", 3, "cpu"),
    ("deepspeed", 0, "none"),
    ("deepspeed", 1, "none"),
    ("deepspeed", 1, "cpu"),
    ("deepspeed", 2, "none"),
    ("deepspeed", 2, "cpu"),
    ("deepspeed", 3, "none"),
    ("deepspeed", 3, "cpu"),
]
PRECISIONS = ["fp32", "bf16"]
ALL_PRECISIONS = ["fp32", "bf16", "fp16"]  # fp16 runs on CPU too (slowly), with loss scaling
CHECKPOINTING = ["none", "selective", "full"]
EIGHT_BIT = [False, True]
OPTIMIZERS = ["adamw", "adam", "sgd"]
# Rates at which the tiny GPT's loss falls within 4 steps (SGD with momentum 0.9 needs a larger one).
LEARNING_RATES = {"adamw": 3e-3, "adam": 3e-3, "sgd": 0.1}


def strategy_plan(
    strategy: tuple[str, int, str], precision: str, ckpt: str, eight_bit: bool, optimizer: str = "adamw"
) -> PlanBuilder:
    engine, stage, offload = strategy
    return (
        make_plan().engine(engine, stage).offload(offload).precision(precision).ckpt(ckpt)
        .eight_bit(eight_bit).optimizer(optimizer).learning_rate(LEARNING_RATES[optimizer])
    )  # fmt: skip


def pairwise(dimensions: list[list[Any]]) -> list[tuple[Any, ...]]:
    """A small set of combinations covering every pair of values of every two dimensions (greedy, deterministic)."""
    import itertools

    def pairs(combo: tuple[Any, ...]) -> set[tuple[int, int, int, int]]:
        indices = [dim.index(value) for dim, value in zip(dimensions, combo, strict=True)]
        return {(a, indices[a], b, indices[b]) for a, b in itertools.combinations(range(len(dimensions)), 2)}

    candidates = list(itertools.product(*dimensions))
    uncovered = set().union(*(pairs(c) for c in candidates))
    chosen: list[tuple[Any, ...]] = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def cpu_cannot_run(plan: PlanBuilder) -> str | None:
    """Why this CPU cannot run `plan`, or None: DeepSpeed refuses fp16 on a CPU without oneDNN fp16
    (AVX512-FP16 / AMX-FP16; e.g. AMD EPYC), a capability of the machine like a GPU's presence."""
    wire = plan.wire()
    if wire["engine"] != "deepspeed" or wire["precision"] != "fp16":
        return None
    import torch

    if torch.cuda.is_available() or torch.ops.mkldnn._is_mkldnn_fp16_supported():
        return None
    return "DeepSpeed refuses fp16 on this CPU (no oneDNN fp16: AVX512-FP16/AMX); runs where the CPU has it"


def run_as_user(uid: int, work: Any) -> Any:
    """`work()` in a forked child whose UID, GID and only group are `uid` (needs root; what the child
    imports lazily must be importable by that user, so import it here first); its JSON-able result.
    An exception in the child fails the caller with its text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            try:
                os.setgroups([uid])
                os.setgid(uid)
                os.setuid(uid)
                payload = {"value": work()}
            except BaseException as error:  # reported to the parent, which asserts on it
                payload = {"error": f"{type(error).__name__}: {error}"}
            with os.fdopen(write, "w", encoding="utf-8") as out:
                json.dump(payload, out)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as source:
        text = source.read()
    os.waitpid(pid, 0)
    payload = json.loads(text)
    assert "error" not in payload, f"the child running as UID {uid} failed: {payload['error']}"
    return payload["value"]

"""Refuse a Plan the runtime cannot honour, before any training (termination reason InvalidPlan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.peft_rules import peft_engine_problem
from memfit.api.plan import Plan
from pydantic import ValidationError

from memfit_trainer.termination import (
    Reason,
    TerminationMessage,
    exit_code,
    termination_path,
    write_termination_message,
)

FSDP_STAGES = (2, 3)  # FSDP2: 2 = reshard_after_forward=False (ZeRO-2-like), 3 = full shard


class InvalidPlanError(ValueError):
    """The plan cannot be applied; the message lists every reason."""


@dataclass(frozen=True, slots=True)
class RuntimeFacts:
    """What the pod offers, as seen at start."""

    world_size: int
    cuda: bool
    bf16_supported: bool = True
    async_io: bool = True


def plan_problems(plan: Plan, facts: RuntimeFacts) -> list[str]:
    """Every reason the plan cannot run here (empty when it can). Pure."""
    reasons: list[str] = []
    for name, value in (
        ("engine", plan.engine),
        ("precision", plan.precision),
        ("activationCheckpointing", plan.activation_checkpointing),
        ("offload", plan.offload),
    ):
        if value.value == "auto":
            reasons.append(f"{name} is 'auto': the planner must resolve it before launch")
    if plan.problem is None:
        reasons.append("problem is missing: the plan must carry the job's problem")
    if plan.training is None:
        reasons.append("training is missing: the plan must carry the job's training spec")
    reasons += _engine_problems(plan, facts)
    reasons += _precision_problems(plan, facts)
    reasons += _technique_problems(plan)
    reasons += _peft_problems(plan)
    if plan.world_size != facts.world_size:
        reasons.append(
            f"plan is for {plan.nodes} node(s) x {plan.gpus_per_node} GPU(s) = world size {plan.world_size}, "
            f"but this job runs with world size {facts.world_size}"
        )
    if plan.training is not None:
        samples = plan.global_batch(plan.world_size)
        if samples != plan.training.global_batch_size:
            reasons.append(
                f"microBatchSize {plan.micro_batch_size} x gradientAccumulationSteps "
                f"{plan.gradient_accumulation_steps} x world size {plan.world_size} = {samples} samples per "
                f"step, but training.globalBatchSize is {plan.training.global_batch_size}"
            )
    return reasons


def _engine_problems(plan: Plan, facts: RuntimeFacts) -> list[str]:
    reasons: list[str] = []
    if plan.engine == Engine.DDP:
        if plan.zero_stage != 0:
            reasons.append(
                f"ZeRO-{plan.zero_stage} with DDP: DDP replicates all states (stage 0); "
                "use engine deepspeed or fsdp to shard"
            )
        if plan.offload != Offload.NONE:
            reasons.append(
                f"offload {plan.offload.value} with DDP: offload needs deepspeed (cpu, nvme) or fsdp (cpu)"
            )
    elif plan.engine == Engine.FSDP:
        if plan.zero_stage not in FSDP_STAGES:
            reasons.append(
                f"FSDP with zeroStage {plan.zero_stage}: FSDP shards gradients and optimizer state always; "
                "use 2 (keep parameters after forward) or 3 (reshard parameters)"
            )
        if plan.offload == Offload.NVME:
            reasons.append("offload nvme with FSDP: NVMe offload needs engine deepspeed (ZeRO-Infinity)")
    elif plan.engine == Engine.DEEPSPEED:
        if plan.offload != Offload.NONE and plan.zero_stage == 0:
            reasons.append(f"offload {plan.offload.value} with ZeRO-0: DeepSpeed offloads from ZeRO-1 on")
        if plan.offload == Offload.NVME:
            if plan.zero_stage != 3:
                reasons.append(
                    f"offload nvme with ZeRO-{plan.zero_stage}: DeepSpeed offloads to NVMe with ZeRO-3 only"
                )
            if not plan.nvme_path:
                reasons.append("offload nvme without nvmePath: the plan must name the NVMe mount")
            if not facts.async_io:
                reasons.append("offload nvme: DeepSpeed's async_io op is not available here (needs libaio)")
    elif plan.engine != Engine.AUTO:
        reasons.append(f"unknown engine {plan.engine.value!r}: expected ddp, fsdp or deepspeed")
    return reasons


def _precision_problems(plan: Plan, facts: RuntimeFacts) -> list[str]:
    # fp16 is not refused on CPU: DDP/FSDP (autocast + GradScaler) and DeepSpeed (fp16 with dynamic
    # loss scaling) all train with it there (slowly), so CPU stand-ins for GPU pods can run fp16 plans.
    if plan.precision in (Precision.BF16, Precision.BF16_PURE) and facts.cuda and not facts.bf16_supported:
        return [f"precision {plan.precision.value} on a GPU without bf16 support (compute capability < 8.0): "
                "use fp16 or fp32"]
    return []


def _technique_problems(plan: Plan) -> list[str]:
    """bf16-pure and the optimizer step in backward where the trainer implements them (the planner plans
    them nowhere else)."""
    reasons: list[str] = []
    if plan.precision == Precision.BF16_PURE:
        if plan.engine not in (Engine.DDP, Engine.FSDP):
            reasons.append(f"precision bf16-pure with {plan.engine.value}: bf16-pure runs with ddp or fsdp")
        if plan.offload != Offload.NONE:
            reasons.append(f"precision bf16-pure with offload {plan.offload.value}: bf16-pure runs without offload")
        if plan.peft.value != "none":
            reasons.append(f"precision bf16-pure with {plan.peft.value}: adapters train with precision bf16")
    if plan.activation_offload and plan.peft.value != "none":
        reasons.append(f"activationOffload with {plan.peft.value}: activation offload trains a full fine-tune")
    if plan.optimizer_in_backward:
        if plan.engine != Engine.DDP or plan.world_size != 1:
            reasons.append(f"optimizerInBackward with {plan.engine.value} at world size {plan.world_size}: "
                           "the step in backward runs with ddp on one GPU")
        if plan.gradient_accumulation_steps != 1:
            reasons.append(f"optimizerInBackward with gradientAccumulationSteps "
                           f"{plan.gradient_accumulation_steps}: each gradient is applied as soon as it is ready")
        if plan.precision == Precision.FP16:
            reasons.append("optimizerInBackward with fp16: a loss-scaled gradient cannot be checked before its step")
    return reasons


def check_plan(plan: Plan, facts: RuntimeFacts) -> None:
    """Raise InvalidPlanError listing every reason when the plan cannot run here."""
    reasons = plan_problems(plan, facts)
    if reasons:
        raise InvalidPlanError("; ".join(reasons))


def checkpointing_enabled(plan: Plan) -> bool:
    """True when the plan asks for any activation checkpointing."""
    return plan.activation_checkpointing in (Checkpointing.SELECTIVE, Checkpointing.SELECTIVE_OP, Checkpointing.FULL)


def load_plan(path: Path) -> Plan:
    """Parse the Plan JSON (camelCase); InvalidPlanError names the field on any problem."""
    try:
        return Plan.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise InvalidPlanError(f"cannot read plan {path}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'plan'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidPlanError(f"plan {path} is not a valid memfit.dev/plan/v1: {details}") from exc


def refuse_invalid(error: Exception, *, rank: int | None, environ: Mapping[str, str]) -> int:
    """Write the InvalidPlan termination message; its exit code."""
    message = TerminationMessage(reason=Reason.INVALID_PLAN, rank=rank, message=str(error))
    write_termination_message(message, termination_path(dict(environ)))
    return exit_code(Reason.INVALID_PLAN)


def _peft_problems(plan: Plan) -> list[str]:
    """LoRA/QLoRA plans need their adapter settings and an engine, stage and offload that can hold them
    (memfit.api.peft_rules.peft_engine_problem)."""
    if plan.peft.value == "none":
        return []
    if plan.peft.value == "auto":
        return ["peft is 'auto': the planner must resolve it before launch"]
    reasons = []
    if plan.adapter is None:
        reasons.append(f"peft {plan.peft.value} needs plan.adapter (rank, alpha, target modules)")
    problem = peft_engine_problem(plan.peft, engine=plan.engine, zero_stage=plan.zero_stage, offload=plan.offload)
    if problem is not None:
        reasons.append(problem)
    return reasons

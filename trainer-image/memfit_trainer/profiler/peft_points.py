"""The LoRA/QLoRA variant of a profile: when the job allows PEFT, the same model with the job's adapters
(frozen 16-bit or 4-bit base) is measured at bf16, no checkpointing, micro-batch 1 and 2, and reported
as measurements marked `peft` (memfit.memory.calibration uses them for PEFT strategies only).

A failure here never fails the profile: the full fine-tune's measurements stand, the PEFT prediction
stays analytic, and stderr says why.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from memfit.api.common import PeftMethod, Precision, QuantType
from memfit.api.peft import AdapterSettings
from memfit.api.profile import Measurement

from memfit_trainer.problems import TrainingProblem
from memfit_trainer.profiler.configs import parse_configs
from memfit_trainer.profiler.measure import ConfigResult, ElisionUnsafe, MeasureOptions, measure_configs

PEFT_CONFIGS = parse_configs("bf16:none:1,bf16:none:2")


def measure_peft_variants(
    build: Callable[[], TrainingProblem], options: Any, *, device: torch.device, elide: bool, room: int,
    to_measurement: Callable[[ConfigResult], Measurement],
) -> list[Measurement]:
    """Measurements of each allowed PEFT method's variant (as many as `room` leaves), marked `peft`."""
    if not options.peft_methods or not options.lora_targets:
        return []
    adapter = AdapterSettings(rank=options.lora_rank, alpha=2 * options.lora_rank, dropout=options.lora_dropout,
                              target_modules=list(options.lora_targets), quant_type=QuantType(options.qlora_quant),
                              double_quant=options.qlora_double_quant)
    out: list[Measurement] = []
    for name in options.peft_methods:
        if room - len(out) < len(PEFT_CONFIGS):
            break
        method = PeftMethod(name)
        try:
            out += _measure(build, method, adapter, options, device=device, elide=elide, to_measurement=to_measurement)
        except Exception as exc:  # the PEFT variant is extra: report and keep the profile
            print(f"memfit-trainer profile: the {name} variant was not measured: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
    return out


def _measure(build: Callable[[], TrainingProblem], method: PeftMethod, adapter: AdapterSettings, options: Any, *,
             device: torch.device, elide: bool, to_measurement: Callable[[ConfigResult], Measurement]
             ) -> list[Measurement]:
    from memfit_trainer.strategies.peft import apply_peft

    def build_peft() -> TrainingProblem:
        problem = build()
        apply_peft(problem, method=method, adapter=adapter, precision=Precision.BF16, device=device)
        return problem

    def run(elided: bool) -> list[ConfigResult]:
        settings = MeasureOptions(
            device=device, optimizer=options.optimizer,
            steps_per_config=options.steps_per_config or (1 if elided else 3), elide=elided,
            elide_memory_bound=elided and options.compute != "elide-compute",
            split_optimizer=elided if options.split_optimizer is None else options.split_optimizer,
        )
        return measure_configs(build_peft, PEFT_CONFIGS, settings).results

    try:
        results = run(elide)
    except ElisionUnsafe:
        results = run(False)
    return [to_measurement(r).model_copy(update={"peft": method}) for r in results if r.error is None]

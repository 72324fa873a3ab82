"""`spec.container`: the user's own training container instead of memfit's trainer.

memfit's plan reaches the script the ways scripts already read their settings: environment variables
(`MEMFIT_MICRO_BATCH_SIZE`, ... : `memfit.api.pod`; `args` can say `$(MEMFIT_MICRO_BATCH_SIZE)`,
Kubernetes' own expansion), the torchrun rendezvous variables (`PET_*`, read by `torchrun`), and generated
files mounted read-only: the plan as JSON and, for a script that takes one, the DeepSpeed config. `honors`
says which knobs the script really applies: the planner varies only those and plans the rest as the script
runs it (the values `spec.strategy` pins). `memfit.api.own_code_rules` refuses a combination the planner
could not keep to, naming the field.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from memfit.api.common import IMAGE_MAX, LIST_MAX, ApiModel, Engine, Offload
from memfit.api.pod_template import ARGS_MAX, PATH_MAX, VALUE_MAX, EnvVar


class Knob(StrEnum):
    """A setting memfit's plan chooses that a script can apply."""

    MICRO_BATCH_SIZE = "microBatchSize"  # MEMFIT_MICRO_BATCH_SIZE
    GRADIENT_ACCUMULATION = "gradientAccumulation"  # MEMFIT_GRADIENT_ACCUMULATION_STEPS
    PRECISION = "precision"  # MEMFIT_PRECISION: fp32, bf16 or fp16 (autocast)
    ACTIVATION_CHECKPOINTING = "activationCheckpointing"  # MEMFIT_ACTIVATION_CHECKPOINTING: none/selective/full
    OPTIMIZER_8BIT = "optimizer8bit"  # MEMFIT_OPTIMIZER_8BIT: true/false
    DEEPSPEED_CONFIG = "deepspeedConfig"  # MEMFIT_DEEPSPEED_CONFIG: the file deepspeed.initialize / --deepspeed takes


# What a DeepSpeed config carries (DeepSpeed applies them when the script passes it to deepspeed.initialize).
DEEPSPEED_CARRIES = (Knob.MICRO_BATCH_SIZE, Knob.GRADIENT_ACCUMULATION, Knob.PRECISION)


class OwnContainer(ApiModel):
    """The user's training container: its image and command run in each training pod instead of
    memfit's trainer, with memfit's plan in its environment and files."""

    image: str = Field(min_length=1, max_length=IMAGE_MAX, description="The training image.")
    command: list[Annotated[str, Field(max_length=VALUE_MAX)]] | None = Field(
        default=None, max_length=ARGS_MAX,
        description="Entrypoint, e.g. [torchrun, train.py]: torchrun reads memfit's PET_* variables (nodes, "
        "processes per node, node rank, rendezvous address).")
    args: list[Annotated[str, Field(max_length=VALUE_MAX)]] | None = Field(
        default=None, max_length=ARGS_MAX,
        description="Arguments; $(MEMFIT_MICRO_BATCH_SIZE) and the other variables expand.")
    env: list[EnvVar] | None = Field(
        default=None, max_length=LIST_MAX, description="Its own variables (memfit's names are refused).")
    working_dir: str | None = Field(default=None, max_length=PATH_MAX, description="Working directory.")
    honors: list[Knob] = Field(
        default_factory=list, max_length=len(Knob),
        description="The knobs the script applies (microBatchSize, gradientAccumulation, precision, "
        "activationCheckpointing, optimizer8bit, deepspeedConfig). The planner varies only these; a knob not "
        "listed is planned at the value spec.strategy pins (what the script does).")

    probe: bool = Field(
        default=True,
        description="Profile and monitor the script itself: the profiling pod also runs this container's command under "
        "memfit's probe at micro-batches 1 and 2 (needs `command`, python3 >= 3.11 and torch in the image), and the "
        "plan is calibrated by the peaks it measures; the training pods run it under the probe too, for "
        "status.progress, the first-steps memory check and the measured peak. false: planned from spec.problem's "
        "profile only, and the command runs as it is.")

    def applies(self, knob: Knob) -> bool:
        """The script applies `knob`: listed, or carried by a DeepSpeed config it takes."""
        return knob in self.honors or (Knob.DEEPSPEED_CONFIG in self.honors and knob in DEEPSPEED_CARRIES)

    @property
    def engine(self) -> Engine:
        """The engine the script runs: DeepSpeed when it takes memfit's DeepSpeed config, else torch's
        DistributedDataParallel (what a torchrun script without one does)."""
        return Engine.DEEPSPEED if Knob.DEEPSPEED_CONFIG in self.honors else Engine.DDP

    @property
    def offload(self) -> Offload | None:
        """Offload only through a DeepSpeed config; None = the planner's choice."""
        return None if Knob.DEEPSPEED_CONFIG in self.honors else Offload.NONE

"""The training configurations a profile measures, their default set and their command-line form."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.api.common import Checkpointing, Precision
from memfit.api.job import OptimizerKind

from memfit_trainer.profiler.errors import ProfileInputError

MEASURABLE_PRECISIONS = (Precision.FP32, Precision.BF16, Precision.FP16)
MEASURABLE_CHECKPOINTING = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)
MAX_CONFIGS = 16  # Profile.measurements holds at most 16 entries (the 4 KiB termination message)


@dataclass(frozen=True, slots=True, order=True)
class ProfileConfig:
    """One single-process training configuration: precision, checkpointing, micro-batch, 8-bit state."""

    precision: Precision = Precision.FP32
    checkpointing: Checkpointing = Checkpointing.NONE
    micro_batch_size: int = 1
    optimizer8bit: bool = False

    @property
    def key(self) -> str:
        """Compact form, also the command-line syntax: `bf16:full:2:8bit`."""
        bits = "8bit" if self.optimizer8bit else "32bit"
        return f"{self.precision.value}:{self.checkpointing.value}:{self.micro_batch_size}:{bits}"


# The default set: two micro-batch sizes give the per-sample activation slope for each
# (precision, checkpointing) pair the planner uses most; one 8-bit point gives the optimizer-state
# difference. Seven points keep GPT-2-small (124M) under 60 s on a 2-core CPU (docs/profiler.md).
DEFAULT_CONFIGS: tuple[ProfileConfig, ...] = (
    ProfileConfig(Precision.FP32, Checkpointing.NONE, 1),
    ProfileConfig(Precision.FP32, Checkpointing.NONE, 2),
    ProfileConfig(Precision.BF16, Checkpointing.NONE, 1),
    ProfileConfig(Precision.BF16, Checkpointing.NONE, 2),
    ProfileConfig(Precision.BF16, Checkpointing.FULL, 1),
    ProfileConfig(Precision.BF16, Checkpointing.FULL, 2),
    ProfileConfig(Precision.BF16, Checkpointing.NONE, 1, optimizer8bit=True),
)


def full_grid(micro_batch_sizes: tuple[int, int] = (1, 2)) -> tuple[ProfileConfig, ...]:
    """fp32/bf16 x none/full x two micro-batch sizes x 32/8-bit: 16 points (the Profile's maximum)."""
    return tuple(
        ProfileConfig(precision, ckpt, mbs, eight)
        for eight in (False, True)
        for precision in (Precision.FP32, Precision.BF16)
        for ckpt in (Checkpointing.NONE, Checkpointing.FULL)
        for mbs in micro_batch_sizes
    )


def parse_config(text: str) -> ProfileConfig:
    """Parse `precision:checkpointing:micro_batch[:8bit|32bit]`, e.g. `bf16:full:2:8bit`."""
    parts = text.strip().split(":")
    if len(parts) not in (3, 4):
        raise ProfileInputError(
            "configs", f"{text!r} must look like precision:checkpointing:microBatch[:8bit], e.g. bf16:full:2"
        )
    precision = _choice(parts[0], MEASURABLE_PRECISIONS, "precision", text)
    ckpt = _choice(parts[1], MEASURABLE_CHECKPOINTING, "checkpointing", text)
    try:
        mbs = int(parts[2])
    except ValueError:
        mbs = 0
    if mbs < 1:
        raise ProfileInputError(
            "configs", f"{text!r}: micro-batch must be a positive integer, got {parts[2]!r}"
        )
    bits = parts[3] if len(parts) == 4 else "32bit"
    if bits not in ("8bit", "32bit"):
        raise ProfileInputError("configs", f"{text!r}: optimizer state must be 8bit or 32bit, got {bits!r}")
    return ProfileConfig(Precision(precision), Checkpointing(ckpt), mbs, bits == "8bit")


def parse_configs(text: str) -> tuple[ProfileConfig, ...]:
    """A comma-separated list of configurations, or `default` / `grid`; duplicates are dropped."""
    name = text.strip()
    if name == "default":
        return DEFAULT_CONFIGS
    if name == "grid":
        return full_grid()
    configs = tuple(dict.fromkeys(parse_config(part) for part in name.split(",") if part.strip()))
    if not configs:
        raise ProfileInputError("configs", "no configuration given")
    if len(configs) > MAX_CONFIGS:
        raise ProfileInputError(
            "configs", f"at most {MAX_CONFIGS} configurations fit a Profile, got {len(configs)}"
        )
    return configs


def _choice(
    value: str, allowed: tuple[Precision, ...] | tuple[Checkpointing, ...], what: str, text: str
) -> str:
    names = [a.value for a in allowed]
    if value not in names:
        raise ProfileInputError(
            "configs", f"{text!r}: {what} must be one of {', '.join(names)}, got {value!r}"
        )
    return value


def optimizer_kind(name: str) -> OptimizerKind:
    """The base optimizer of the measured runs (the job's training.optimizer)."""
    try:
        return OptimizerKind(name)
    except ValueError:
        allowed = ", ".join(k.value for k in OptimizerKind)
        raise ProfileInputError("optimizer", f"must be one of {allowed}, got {name!r}") from None

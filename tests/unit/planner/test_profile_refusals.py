"""A profile that could not run some precision on its GPU (Profile.skipped): pools of that GPU never plan
it, other GPUs and CPU profiles are unaffected, and a pin to it is refused naming the profile."""

from __future__ import annotations

from memfit.api.common import Checkpointing, Precision
from memfit.api.profile import Profile, SkippedRun
from memfit.catalog import CATALOG
from memfit.memory.problems import shape_from_problem
from memfit.planner import plan
from planner_factories import make_job, make_pool

L4, A10G = make_pool("l4", "l4"), make_pool("a10g", "a10g")


def _profile(device: str, *refused: tuple[Precision, Checkpointing]) -> Profile:
    shape = shape_from_problem(make_job().build().problem)
    return Profile(problem_hash="h", device=device, shape=shape, compute="full", skipped=[
        SkippedRun(kind="configuration", precision=p, checkpointing=c, micro_batch_size=1,
                   reason="NotImplementedError: no bf16 kernel") for p, c in refused])


BF16_ANY = ((Precision.BF16, Checkpointing.NONE), (Precision.BF16, Checkpointing.FULL),
            (Precision.BF16, Checkpointing.SELECTIVE))


def test_a_refused_precision_is_never_planned_on_the_profiled_gpu() -> None:
    job = make_job().build()
    free = plan(job, pools=[L4], catalog=CATALOG)
    assert free.chosen is not None and free.chosen.strategy.config.precision == Precision.BF16
    refused = plan(job, pools=[L4], catalog=CATALOG, profile=_profile("cuda:l4", *BF16_ANY))
    assert refused.chosen is not None
    assert refused.chosen.strategy.config.precision not in (Precision.BF16, Precision.BF16_PURE)
    # Only the pairs refused: bf16 without checkpointing refused leaves bf16 with checkpointing.
    partial = plan(job, pools=[L4], catalog=CATALOG, profile=_profile("cuda:NVIDIA-L4", BF16_ANY[0]))
    assert partial.chosen is not None
    config = partial.chosen.strategy.config
    assert (config.precision, config.activation_checkpointing) != BF16_ANY[0]


def test_refusals_hold_only_for_the_profiled_gpu() -> None:
    job = make_job().build()
    other = plan(job, pools=[A10G], catalog=CATALOG, profile=_profile("cuda:l4", *BF16_ANY))
    assert other.chosen is not None and other.chosen.strategy.config.precision == Precision.BF16
    on_cpu = plan(job, pools=[L4], catalog=CATALOG, profile=_profile("cpu", *BF16_ANY))
    assert on_cpu.chosen is not None and on_cpu.chosen.strategy.config.precision == Precision.BF16


def test_a_pin_to_a_refused_precision_names_the_profile() -> None:
    result = plan(make_job().pin(precision="bf16").build(), pools=[L4], catalog=CATALOG,
                  profile=_profile("cuda:l4", *BF16_ANY))
    assert result.chosen is None
    assert result.message() == (
        "NoFit: l4: the profile found that NVIDIA-L4 cannot run this job's step in some precisions (the "
        "profile's skipped list) and strategy.precision is pinned to bf16: pin another precision, or leave it auto")

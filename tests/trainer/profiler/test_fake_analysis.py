"""Zero-GPU analysis: MemTracker / FSDPMemTracker on a fake model agree with the model-state arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from profiler_support import TINY

torch = pytest.importorskip("torch")

from memfit.api.common import Checkpointing  # noqa: E402
from memfit.api.problem import Problem  # noqa: E402
from memfit_trainer.profiler.fake import FakeConfig, fake_peak  # noqa: E402

GPT = Problem.model_validate(TINY["gpt"])
PARAMS = 2 * (12 * 64 * 64 + 13 * 64) + 2 * 512 * 64 + 64 * 64 + 2 * 64


def test_single_process_peak_holds_the_model_states_and_grows_with_the_batch() -> None:
    one = fake_peak(GPT, FakeConfig(micro_batch_size=1))
    four = fake_peak(GPT, FakeConfig(micro_batch_size=4))
    assert one.categories["_MemRefType.PARAM"] == 4 * PARAMS
    assert one.categories["_MemRefType.OPT"] >= 8 * PARAMS
    assert one.peak_bytes >= 12 * PARAMS
    assert four.peak_bytes > one.peak_bytes
    ckpt = fake_peak(GPT, FakeConfig(micro_batch_size=4, checkpointing=Checkpointing.FULL))
    assert ckpt.categories["_MemRefType.ACT"] < four.categories["_MemRefType.ACT"]


def test_eight_bit_state_is_about_a_quarter() -> None:
    eight = fake_peak(GPT, FakeConfig(optimizer8bit=True))
    assert eight.categories["_MemRefType.OPT"] < 0.35 * 8 * PARAMS


FSDP_SCRIPT = """
import json
from memfit.api.common import Precision
from memfit.api.problem import Problem
from memfit_trainer.profiler.fake import FakeConfig, fake_peak
gpt = Problem.model_validate(json.loads(%r))
out = {n: fake_peak(gpt, FakeConfig(fsdp_world_size=n, precision=Precision.BF16)).categories for n in (2, 4)}
print(json.dumps(out))
"""


def test_fsdp_on_fake_ranks_shards_parameters_and_state() -> None:
    # A fresh process: the fake process group cannot coexist with the gloo group other tests create.
    proc = subprocess.run(
        [sys.executable, "-c", FSDP_SCRIPT % json.dumps(TINY["gpt"])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    two, four = result["2"], result["4"]
    sharded = "_FSDPRefType.SHARDED_PARAM"
    assert abs(two[sharded] - 2 * PARAMS) <= 4 * 64 * 8  # shards are padded to the world size
    assert four[sharded] < two[sharded]
    assert four["Total"] < two["Total"]

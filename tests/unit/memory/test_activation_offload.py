"""The memory and time terms of activation offload (docs/techniques.md): what leaves the device, what comes back in a
block's backward, what the host holds, what the transfers cost, and what it cannot run with."""

from __future__ import annotations

import pytest
from memfit.api.common import PeftMethod
from memfit.memory import Shape, predict_memory, strategy_problem
from memfit.memory.activations import activation_terms, matmul_outputs
from memfit.memory.predict import PINNED_HOST_ROUNDING, memory_terms
from memfit.timing.step import GpuSpeed, estimate_step_seconds
from memory_factories import S, model_shape

BIG = Shape.of(model_shape(parameters=7_000_000_000, hidden=4096, heads=32, ffn_hidden=16384, layers=32))


@pytest.mark.parametrize("ckpt", ["none", "selective", "selective-op", "full"])
def test_the_blocks_saved_tensors_leave_the_device_and_the_host_holds_them(ckpt: str) -> None:
    kept = activation_terms(BIG, S().ddp().bf16().ckpt(ckpt).build())
    moved = activation_terms(BIG, S().ddp().bf16().ckpt(ckpt).act_offload().build())
    gone = kept.activation_bytes_per_sample - moved.activation_bytes_per_sample
    # Exactly what the device no longer holds at the loss is on the host (less one block's worth of nothing).
    assert moved.offloaded_bytes_per_sample == pytest.approx(gone) and gone > 0
    # The head's log-probabilities and the loss's buffers stay on the device.
    assert moved.temporary_bytes_per_sample == kept.temporary_bytes_per_sample
    assert moved.block_activation_bytes_per_sample <= kept.block_activation_bytes_per_sample


def test_full_checkpointing_moves_each_blocks_input_and_selective_op_keeps_its_matmul_outputs() -> None:
    full = activation_terms(BIG, S().ddp().bf16().ckpt("full").act_offload().build())
    residual = 4 * BIG.hidden  # autocast under DDP keeps the residual stream in fp32
    assert full.offloaded_bytes_per_sample == BIG.layers * residual * BIG.tokens
    op = activation_terms(BIG, S().ddp().bf16().ckpt("selective-op").act_offload().build())
    assert op.offloaded_bytes_per_sample == full.offloaded_bytes_per_sample
    kept = activation_terms(BIG, S().ddp().bf16().ckpt("selective-op").build())
    assert op.activation_bytes_per_sample == pytest.approx(
        kept.activation_bytes_per_sample - full.offloaded_bytes_per_sample)
    assert op.activation_bytes_per_sample > BIG.layers * matmul_outputs(BIG, 2) * BIG.tokens


def test_host_ram_grows_with_the_micro_batch_and_counts_pinned_rounding_on_cuda() -> None:
    cuda = memory_terms(BIG, S().ddp().bf16().ckpt("full").act_offload().build())
    cpu = memory_terms(BIG, S().ddp().bf16().ckpt("full").act_offload().device("cpu").build())
    per_sample = activation_terms(BIG, S().ddp().bf16().ckpt("full").act_offload().build()).offloaded_bytes_per_sample
    assert cpu.host_bytes_per_sample == per_sample
    assert cuda.host_bytes_per_sample == PINNED_HOST_ROUNDING * per_sample
    estimate = predict_memory(BIG, S().ddp().bf16().ckpt("full").act_offload().mbs(4).build())
    assert estimate.host_bytes == estimate.host_activation_bytes == pytest.approx(4 * cuda.host_bytes_per_sample, abs=1)
    assert predict_memory(BIG, S().ddp().bf16().mbs(4).build()).host_bytes == 0


def test_the_transfers_cross_pcie_twice_per_sample_and_nothing_hides_them() -> None:
    gpu = GpuSpeed(bf16_tflops=989, fp16_tflops=989, fp32_tflops=67, pcie_gbps=25.0)
    base = S().ddp().bf16().ckpt("full").mbs(2)
    plain = estimate_step_seconds(BIG, base.build(), gpu)
    moved = estimate_step_seconds(BIG, base.act_offload().build(), gpu)
    per_sample = activation_terms(BIG, base.act_offload().build()).offloaded_bytes_per_sample
    assert plain.offload_seconds == 0
    assert moved.offload_seconds == pytest.approx(2 * 2 * per_sample / 25e9)
    assert moved.compute_seconds == plain.compute_seconds


@pytest.mark.parametrize("method", [PeftMethod.LORA, PeftMethod.QLORA])
def test_lora_and_qlora_are_refused(method: PeftMethod) -> None:
    problem = strategy_problem(S().ddp().bf16().act_offload()._config(peft=method).build())
    assert problem is not None and "activation offload trains a full fine-tune" in problem


@pytest.mark.parametrize("builder", [
    S().ddp().bf16(), S().ddp().bf16().act_offload(), S().ddp().bf16().ckpt("full").act_offload(),
    S().ddp().pure().in_backward().chunked(), S().fsdp(3).world(8).bf16().ckpt("selective-op"),
    S().deepspeed(3).world(8).bf16().ckpt("full"),
], ids=["ddp bf16", "offload", "offload full", "pure in-backward chunked", "fsdp3 selective-op", "zero3 full"])
def test_the_planners_lines_are_the_activation_moments_exactly(builder: S) -> None:
    """MemoryTerms builds its (fixed, per-sample) lines without moment objects on the planner's hot path; they must
    be the activation moments' sums, bit for bit, with and without accumulation."""
    terms = memory_terms(BIG, builder.build())
    for accumulating, lines in ((False, terms._lines[0]), (True, terms._lines[1])):
        moments = terms.activation_moments(2 if accumulating else 1)
        assert lines == tuple((m.other_bytes + m.gradient_bytes,
                               m.activation_bytes_per_sample + m.temporary_bytes_per_sample) for m in moments)

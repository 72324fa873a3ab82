"""`memfit estimate` as a user runs it, and the memory model's reading of `auto` that it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memfit.api.common import Checkpointing, Engine, Offload, Precision
from memfit.api.job import OptimizerKind, StrategySpec
from memfit.cli import main
from memfit.memory.strategy import strategy_from_pins

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"
QUICKSTART = str(REPO / "examples" / "quickstart.yaml")


ESTIMATES = {
    "builtin": (["--builtin", "gpt:layers=24,hidden=2048,heads=16,vocab=32000,seq=2048", "--engine", "deepspeed",
                 "--stage", "3", "--world-size", "8", "--precision", "bf16", "--checkpointing", "full",
                 "--micro-batch", "2"], "ZeRO-3 bf16 ckpt-full mbs 2x1"),
    "hf config": (["--hf-config", str(FIXTURES / "gpt2-config.json"), "--seq", "1024", "--optimizer8bit"],
                  "0.124 B parameters (124,439,808)"),
    "job with gpu": (["--job", QUICKSTART, "--engine", "fsdp", "--world-size", "2", "--gpu", "l4"],
                     "on NVIDIA-L4: step"),
    "profile calibration": (["--builtin", "gpt:layers=2,hidden=64,heads=4,vocab=512,seq=64", "--profile",
                             str(FIXTURES / "gpt-profile.json")], "calibrated from the profile"),
    "qlora job": (["--job", str(REPO / "examples" / "llama-70b-qlora.yaml"), "--gpu", "a100-80", "--micro-batch", "1"],
                  "QLoRA DDP bf16 ckpt-full mbs 1x16"),
    "lora flags": (["--hf-config", str(FIXTURES / "gpt2-config.json"), "--seq", "1024", "--peft", "lora", "--lora-rank", "8",
                    "--lora-targets", "c_attn"], "LoRA DDP bf16"),
}


@pytest.mark.parametrize(("args", "expected"), ESTIMATES.values(), ids=ESTIMATES.keys())
def test_estimate_prints_the_breakdown(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *args]) == 0
    out = capsys.readouterr().out
    assert expected in out and "peak per GPU" in out and "optimizer state" in out


def test_estimate_json_is_a_memory_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--hf-config", str(FIXTURES / "gpt2-config.json"), "--seq", "512", "--json"]) == 0
    breakdown = json.loads(capsys.readouterr().out)
    assert breakdown["peakBytes"] == sum(breakdown[k] for k in (
        "parametersBytes", "gradientsBytes", "optimizerBytes", "activationsBytes", "temporariesBytes", "overheadBytes"))


def test_estimate_reports_the_peak_at_three_levels_and_expresses_attention_and_task(
        capsys: pytest.CaptureFixture[str]) -> None:
    def estimate(*extra: str) -> dict[str, int]:
        assert main(["estimate", "--hf-config", str(FIXTURES / "gpt2-config.json"), "--seq", "512", "--json",
                     "--micro-batch", "4", *extra]) == 0
        return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]

    sdpa = estimate()
    assert sdpa["allocatedBytes"] < sdpa["reservedBytes"] < sdpa["peakBytes"]
    # GPT-2 small, 12 layers x 12 heads x 512 positions, 4 samples: on a GPU, eager keeps its fp32 softmax,
    # a 1-byte dropout mask and the 16-bit dropout output (7 B) per score (attn_pdrop 0.1).
    assert estimate("--attention", "eager")["activationsBytes"] - sdpa["activationsBytes"] == 4 * 12 * 12 * 512 * 512 * 7
    classifier = estimate("--task", "sequence-classification")
    # GPT-2's LM head is tied to its embedding: the classifier adds its score matrix (768 x 2, fp32) and drops
    # the fp32 log-probabilities over the 50,257-token vocabulary.
    assert classifier["parametersBytes"] - sdpa["parametersBytes"] == 768 * 2 * 4
    assert classifier["activationsBytes"] < sdpa["activationsBytes"] - 4 * 512 * 50257 * 4
    assert main(["estimate", "--hf-config", str(FIXTURES / "gpt2-config.json"), "--seq", "512", "--task", "masked-lm"]) == 2
    assert "problem.huggingface.task: gpt2 has no masked-lm head" in capsys.readouterr().err
    assert main(["estimate", "--hf-config", str(FIXTURES / "gpt2-config.json"), "--seq", "512"]) == 0
    table = capsys.readouterr().out
    assert "allocated (max_memory_allocated)" in table and "device used (nvidia-smi)" in table


BAD_ESTIMATES = {
    "impossible strategy": (["--builtin", "gpt:layers=2,hidden=64,heads=4", "--engine", "ddp", "--stage", "3"],
                            "strategy: DDP does not shard"),
    "bad builtin": (["--builtin", "gpt:layers=2,hidden=65,heads=4"], "problem.builtin.heads: 4 does not divide"),
    "not an integer": (["--builtin", "gpt:layers=two"], "--builtin.layers: 'two' is not an integer"),
    "unknown gpu": (["--builtin", "gpt:layers=2,hidden=64,heads=4", "--gpu", "v100"], "--gpu: 'v100'"),
    "lora on zero-2": (["--builtin", "gpt:layers=2,hidden=64,heads=4", "--peft", "lora", "--engine", "deepspeed",
                        "--stage", "2"], "LoRA on DeepSpeed runs with ZeRO stage 3"),
    "qlora on zero-3": (["--builtin", "gpt:layers=2,hidden=64,heads=4", "--peft", "qlora", "--engine", "deepspeed",
                         "--stage", "3"], "QLoRA does not run on DeepSpeed"),
}


@pytest.mark.parametrize(("args", "message"), BAD_ESTIMATES.values(), ids=BAD_ESTIMATES.keys())
def test_estimate_bad_input_exits_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", *args]) == 2
    assert message in capsys.readouterr().err


AUTO = {
    "everything auto": ({}, (Engine.DDP, 0, Precision.BF16, Checkpointing.NONE, Offload.NONE, False, 1, 4)),
    "deepspeed means ZeRO-2": ({"engine": "deepspeed"}, (Engine.DEEPSPEED, 2, Precision.BF16, Checkpointing.NONE,
                                                          Offload.NONE, False, 1, 4)),
    "fsdp means full shard": ({"engine": "fsdp"}, (Engine.FSDP, 3, Precision.BF16, Checkpointing.NONE, Offload.NONE,
                                                   False, 1, 4)),
    "pins are kept": ({"engine": "deepspeed", "zeroStage": 3, "precision": "fp16", "offload": "cpu",
                       "activationCheckpointing": "full", "optimizer8bit": "enabled", "microBatchSize": 2},
                      (Engine.DEEPSPEED, 3, Precision.FP16, Checkpointing.FULL, Offload.CPU, True, 2, 2)),
}


@pytest.mark.parametrize(("pins", "expected"), AUTO.values(), ids=AUTO.keys())
def test_auto_reads_as_the_usual_setup(pins: dict[str, object], expected: tuple[object, ...]) -> None:
    """`auto` in an estimate: DDP (DeepSpeed ZeRO-2, FSDP full shard), bf16, nothing saved, micro-batch 1,
    and the accumulation that keeps the global batch (16 samples on 4 GPUs: 16 / (4 x micro-batch))."""
    s = strategy_from_pins(StrategySpec.model_validate(pins), optimizer=OptimizerKind.ADAMW, world_size=4,
                           global_batch_size=16)
    c = s.config
    assert (c.engine, c.zero_stage, c.precision, c.activation_checkpointing, c.offload, c.optimizer8bit,
            c.micro_batch_size, c.gradient_accumulation_steps) == expected
    assert (s.world_size, s.gpus_per_node) == (4, 4)


def test_auto_without_a_global_batch_accumulates_once_and_caps_gpus_per_node() -> None:
    s = strategy_from_pins(StrategySpec(), optimizer=OptimizerKind.SGD, world_size=16)
    assert (s.config.gradient_accumulation_steps, s.gpus_per_node, s.optimizer) == (1, 8, OptimizerKind.SGD)
    pinned = strategy_from_pins(StrategySpec(), optimizer=OptimizerKind.ADAMW, world_size=2, accumulation_steps=3)
    assert pinned.config.gradient_accumulation_steps == 3


def test_estimate_with_a_profile_works_for_entrypoint_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    job, profile = str(FIXTURES / "cnn-entrypoint-job.yaml"), str(FIXTURES / "cnn-profile.json")
    assert main(["estimate", "--job", job, "--profile", profile, "--device", "cpu", "--json"]) == 0
    breakdown = json.loads(capsys.readouterr().out)
    assert breakdown["sources"]["activations"] == "measured"
    # The fixture's bare fp32/none curve: 18,724,760 B above the resident state at micro-batch 16.
    assert breakdown["activationsBytes"] + breakdown["temporariesBytes"] == pytest.approx(18_724_760, rel=0.01)
    assert main(["estimate", "--job", job, "--profile", profile]) == 0
    assert "sources: parameters analytic, optimizer analytic, activations measured" in capsys.readouterr().out


def test_estimate_of_an_entrypoint_job_without_a_profile_says_what_is_missing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["estimate", "--job", str(FIXTURES / "cnn-entrypoint-job.yaml")]) == 2
    assert "pass --profile" in capsys.readouterr().err


def test_a_qlora_estimate_is_far_below_the_full_fine_tune(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(REPO / "examples" / "llama-70b-qlora.yaml")
    assert main(["estimate", "--job", job, "--micro-batch", "1", "--json"]) == 0
    qlora = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--job", job, "--micro-batch", "1", "--peft", "none", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    # 70.6 B parameters: a 4-bit base is about 37.6 GiB; 16-bit weights plus fp32 states are > 1 TiB
    assert 37 * 2**30 < qlora["parametersBytes"] < 38.5 * 2**30
    assert full["peakBytes"] > 10 * qlora["peakBytes"]

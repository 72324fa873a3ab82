"""A Hugging Face `Trainer` script that takes memfit's plan the way such scripts take settings
(docs/own-code.md): `TrainingArguments` from memfit's variables, nothing else changed.

Run by `torchrun` (which reads memfit's PET_* variables) or as one process. The plan's micro-batch,
gradient accumulation, precision, activation checkpointing, 8-bit optimizer, steps and learning rate
become the arguments of the same names; with `honors: [deepspeedConfig]` the pod carries memfit's
DeepSpeed config and the Trainer runs under it (the Trainer checks that the config's batch sizes match its
own arguments, so a script that ignored memfit's micro-batch would stop here, not train another plan).
Checkpoints go to MEMFIT_CHECKPOINT_DIR every `--save-every` steps, the newest two kept, and a restarted
pod resumes from the newest. The model is a small GPT-2 built from its config (no download): by default 2
layers, hidden 64, 4 heads, vocabulary 512, 64 tokens (`--layers`, `--hidden`, `--heads`, `--vocab`,
`--seq-len` change them), on a fixed synthetic corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

VOCAB, SEQ, HIDDEN, HEADS, LAYERS, SAMPLES = 512, 64, 64, 4, 2, 4096


def setting(name: str, default: str) -> str:
    return os.environ.get(f"MEMFIT_{name}", default)


class Corpus(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Fixed random token rows (the same on every rank and every restart)."""

    def __init__(self, vocab: int = VOCAB, seq: int = SEQ) -> None:
        self.tokens = torch.randint(0, vocab, (SAMPLES, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def agreeing_with(deepspeed_config: str) -> dict[str, object]:
    """The Trainer refuses a DeepSpeed config whose values differ from its own arguments (clipping, the
    optimizer's settings): where memfit's config sets one, the arguments take it from there."""
    if not deepspeed_config:
        return {}
    config = json.loads(pathlib.Path(deepspeed_config).read_text())
    out: dict[str, object] = {"max_grad_norm": float(config.get("gradient_clipping", 0.0))}
    params = (config.get("optimizer") or {}).get("params") or {}
    named = {"lr": "learning_rate", "eps": "adam_epsilon", "weight_decay": "weight_decay"}
    out |= {named[k]: float(v) for k, v in params.items() if k in named}
    if "betas" in params:
        out["adam_beta1"], out["adam_beta2"] = (float(b) for b in params["betas"])
    return out


def arguments(output_dir: str, save_every: int) -> TrainingArguments:
    """memfit's plan as the Trainer's own arguments."""
    precision = setting("PRECISION", "fp32")
    cpu = setting("DEVICE", "") == "cpu" or not torch.cuda.is_available()
    deepspeed_config = setting("DEEPSPEED_CONFIG", "")
    return TrainingArguments(**dict(
        output_dir=output_dir,
        per_device_train_batch_size=int(setting("MICRO_BATCH_SIZE", "8")),
        gradient_accumulation_steps=int(setting("GRADIENT_ACCUMULATION_STEPS", "1")),
        max_steps=int(setting("MAX_STEPS", "20")),
        learning_rate=float(setting("LEARNING_RATE", "0.001")),
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        gradient_checkpointing=setting("ACTIVATION_CHECKPOINTING", "none") != "none",
        optim="adamw_bnb_8bit" if setting("OPTIMIZER_8BIT", "false") == "true" else "adamw_torch",
        deepspeed=deepspeed_config or None,
        use_cpu=cpu,
        save_strategy="steps",
        save_steps=save_every,
        save_total_limit=2,
        logging_steps=1,
        report_to=[],
        dataloader_num_workers=0,
        seed=0,
    ) | agreeing_with(deepspeed_config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--save-every", type=int, default=5, help="steps between two checkpoints")
    for name, default in (("layers", LAYERS), ("hidden", HIDDEN), ("heads", HEADS), ("vocab", VOCAB), ("seq-len", SEQ)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"the model's {name} (default {default})")
    cli = parser.parse_args()
    output = pathlib.Path(setting("CHECKPOINT_DIR", "/tmp/checkpoints")) / "hf-trainer"
    args = arguments(str(output), cli.save_every)
    config = GPT2Config(vocab_size=cli.vocab, n_positions=cli.seq_len, n_embd=cli.hidden, n_layer=cli.layers,
                        n_head=cli.heads)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Corpus(cli.vocab, cli.seq_len))
    resume = get_last_checkpoint(str(output)) if output.is_dir() else None
    result = trainer.train(resume_from_checkpoint=resume)
    if args.process_index == 0:
        world = args.world_size
        resumed = int(resume.rsplit("-", 1)[1]) if resume else 0
        print(json.dumps({"micro_batch": args.per_device_train_batch_size,
                          "accumulation": args.gradient_accumulation_steps, "world": world,
                          "engine": "deepspeed" if args.deepspeed else "ddp", "resumed_from": resumed,
                          "steps": trainer.state.global_step, "loss": round(result.training_loss, 4)}), flush=True)


if __name__ == "__main__":
    main()

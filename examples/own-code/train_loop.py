"""A plain PyTorch training loop that takes memfit's plan the way scripts take settings (docs/own-code.md).

Run by `torchrun` (which reads memfit's PET_* variables): one process per GPU, DDP over NCCL (gloo on a
CPU), or DeepSpeed when the pod carries memfit's DeepSpeed config (MEMFIT_DEEPSPEED_CONFIG). It applies
the micro-batch, gradient accumulation and precision of the plan, saves a checkpoint to
MEMFIT_CHECKPOINT_DIR every `--save-every` steps (keeping the newest two) and resumes from the newest one,
and prints the settings in effect; under memfit's probe it reports each step's loss (the job's progress).
The model is by default the quickstart's: a 2-layer GPT (hidden 64, 4 heads, vocabulary 512, 64 tokens;
`--layers`, `--hidden`, `--heads`, `--vocab`, `--seq-len` change them).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import torch
import torch.distributed as dist
from torch import nn

try:  # the loss in the job's status.progress, under memfit's probe (docs/own-code.md); a no-op anywhere else
    from memfit_trainer.probe.report import report_loss
except ImportError:

    def report_loss(value: float) -> None: ...


VOCAB, SEQ, HIDDEN, HEADS, LAYERS = 512, 64, 64, 4, 2
KEEP_CHECKPOINTS = 2
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class TinyGPT(nn.Module):
    def __init__(self, layers: int = LAYERS, hidden: int = HIDDEN, heads: int = HEADS, vocab: int = VOCAB,
                 seq: int = SEQ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.position = nn.Parameter(torch.zeros(seq, hidden))
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.blocks(self.embed(tokens) + self.position, mask=mask, is_causal=True))


def setting(name: str, default: str) -> str:
    return os.environ.get(f"MEMFIT_{name}", default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--save-every", type=int, default=5, help="steps between two checkpoints")
    for name, default in (("layers", LAYERS), ("hidden", HIDDEN), ("heads", HEADS), ("vocab", VOCAB), ("seq-len", SEQ)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"the model's {name} (default {default})")
    cli = parser.parse_args()
    save_every, vocab, seq = cli.save_every, cli.vocab, cli.seq_len
    micro = int(setting("MICRO_BATCH_SIZE", "8"))
    accumulation = int(setting("GRADIENT_ACCUMULATION_STEPS", "1"))
    precision = setting("PRECISION", "fp32")
    steps = int(setting("MAX_STEPS", "20"))
    lr = float(setting("LEARNING_RATE", "0.001"))
    folder = pathlib.Path(setting("CHECKPOINT_DIR", "/tmp/checkpoints")) / "own-loop"
    deepspeed_config = setting("DEEPSPEED_CONFIG", "")
    cuda = torch.cuda.is_available() and setting("DEVICE", "") != "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 or deepspeed_config:  # DeepSpeed wants a process group even for one process
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    torch.manual_seed(0)
    model = TinyGPT(cli.layers, cli.hidden, cli.heads, vocab, seq).to(device)
    if deepspeed_config:
        import deepspeed

        config = json.loads(pathlib.Path(deepspeed_config).read_text())
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                               dist_init_required=False)
        micro, accumulation = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
        optimizer = engine.optimizer
    else:
        engine = nn.parallel.DistributedDataParallel(model) if world > 1 else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    start = 0
    if (latest := sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))) and not deepspeed_config:
        state = torch.load(latest[-1], map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    print(f"memfit settings in effect: micro_batch={micro} accumulation={accumulation} precision={precision} "
          f"world={world} engine={'deepspeed' if deepspeed_config else 'ddp'} resumed_from={start}", flush=True)
    generator = torch.Generator().manual_seed(rank)
    loss = torch.tensor(0.0)
    for step in range(start, steps):
        for _ in range(accumulation):
            tokens = torch.randint(0, vocab, (micro, seq + 1), generator=generator).to(device)
            autocast = torch.autocast(device.type, dtype=DTYPES[precision]) if precision in DTYPES else None
            with autocast or torch.autocast(device.type, enabled=False):
                logits = engine(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            if deepspeed_config:
                engine.backward(loss)
                engine.step()
            else:
                (loss / accumulation).backward()
        if not deepspeed_config:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        report_loss(loss.item())
        if rank == 0 and not deepspeed_config and ((step + 1) % save_every == 0 or step + 1 == steps):
            folder.mkdir(parents=True, exist_ok=True)
            saved = folder / f"step-{step + 1}.pt"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1},
                       saved.with_suffix(".tmp"))
            saved.with_suffix(".tmp").replace(saved)  # a kill mid-save leaves no half checkpoint to resume from
            for old in sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))[:-KEEP_CHECKPOINTS]:
                old.unlink()
    if rank == 0:
        print(f"finished step {steps} loss {loss.item():.4f}", flush=True)
        summary = {"micro_batch": micro, "accumulation": accumulation, "precision": precision, "world": world,
                   "engine": "deepspeed" if deepspeed_config else "ddp", "resumed_from": start, "steps": steps}
        message = os.environ.get("MEMFIT_TERMINATION_MESSAGE_PATH", "/dev/termination-log")
        pathlib.Path(message).write_text(json.dumps(summary))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A tiny plain PyTorch loop for the probe's tests: reads MEMFIT_MICRO_BATCH_SIZE, or misbehaves on purpose.

`--mode`: honest (what a script should do), ignores (feeds micro-batch 8 whatever memfit plans),
never-steps (forward and backward, no optimizer step), checkpointed (honest, its model under
activation checkpointing: recomputed in the backward pass), exits (exit code 1 after one step), hangs (sleeps
after one step), oom (PyTorch's CUDA out-of-memory error from micro-batch 4 up). `--memfit-meter`: no
probe; measure each step with memfit's own CPU step meter and print the peaks as JSON (the reference).
`--gate FILE --gate-after N`: after step N, wait until FILE exists (a test reads the run's progress meanwhile).
`--report-loss`: report each step's loss through the probe's API (memfit_trainer.probe.report), as docs/own-code.md
shows a script doing it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from memfit.api import pod as contract
from torch import nn
from torch.utils.checkpoint import checkpoint

try:
    from memfit_trainer.probe.report import report_loss
except ImportError:  # not under memfit's probe

    def report_loss(value: float) -> None: ...


SEQ, WIDTH, HIDDEN = 16, 128, 512


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="honest")
    parser.add_argument("--memfit-meter", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=None, help="default: MEMFIT_MICRO_BATCH_SIZE")
    parser.add_argument("--gate", default=None)
    parser.add_argument("--gate-after", type=int, default=0)
    parser.add_argument("--report-loss", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    meter = None
    if args.memfit_meter:
        from memfit_trainer.meters import step_meter

        meter = step_meter(torch.device("cpu"), os.environ)
        meter.start()  # before the model, as memfit's trainer (and the probe) do
    micro = args.micro_batch or int(os.environ.get(contract.ENV_MICRO_BATCH_SIZE, "2"))
    if args.mode == "ignores":
        micro = 8
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    peaks = []
    for step in range(1, args.steps + 1):
        batch = torch.randn(micro, SEQ, WIDTH)
        if args.mode == "checkpointed":
            loss = checkpoint(model, batch.requires_grad_(), use_reentrant=True).square().mean()
        else:
            loss = model(batch).square().mean()
        if args.mode == "oom" and micro >= 4:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (simulated by probe_loop)"
            )
        loss.backward()
        if args.mode != "never-steps":
            optimizer.step()
        if meter is not None:
            peaks.append(meter.end_step().peak_bytes)
        if args.report_loss:
            report_loss(loss.item())
        optimizer.zero_grad(set_to_none=True)
        if step == 1 and args.mode == "exits":
            print("probe_loop: giving up after step 1 on purpose", file=sys.stderr)
            sys.exit(1)
        if step == 1 and args.mode == "hangs":
            time.sleep(3600)
        if args.gate and step == args.gate_after:
            while not os.path.exists(args.gate):
                time.sleep(0.05)
    if meter is not None:
        meter.stop()  # a profiler still running at interpreter exit crashes it
        print(json.dumps({"peakBytes": peaks}))


if __name__ == "__main__":
    main()

"""Pod entry for multi-GPU plans: start torchrun for this node and keep the trainer's exit codes.

torchrun exits 1 whenever a worker fails, which would hide 87 (OOM) and 88 (InvalidPlan) from the
Job's podFailurePolicy. `memfit-trainer train` therefore runs torchrun as a child when it is not
itself under torchrun, then exits with the code that matches the termination message the workers
wrote.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from memfit.api import pod as contract
from memfit.api.plan import Plan

from memfit_trainer.dist import node_rank_from_env
from memfit_trainer.termination import (
    Reason,
    TerminationMessage,
    exit_code,
    read_termination_message,
    termination_path,
    write_termination_message,
)


def torchrun_argv(plan: Plan, *, plan_path: Path, extra: list[str], environ: Mapping[str, str]) -> list[str]:
    """The torchrun command for this node. Flags torchrun would read from PET_* variables are left to them."""
    argv = [sys.executable, "-m", "torch.distributed.run"]
    if contract.ENV_NNODES not in environ:
        argv += ["--nnodes", str(plan.nodes)]
    if contract.ENV_NPROC_PER_NODE not in environ:
        argv += ["--nproc-per-node", str(plan.gpus_per_node)]
    if contract.ENV_TORCHRUN_NODE_RANK not in environ:
        argv += ["--node-rank", str(node_rank_from_env(environ))]
    master_addr = environ.get("MASTER_ADDR")
    if contract.ENV_MASTER_ADDR not in environ and master_addr:
        argv += ["--master-addr", master_addr]
    master_port = environ.get("MASTER_PORT")
    if contract.ENV_MASTER_PORT not in environ and master_port:
        argv += ["--master-port", master_port]
    if plan.nodes == 1 and not master_addr and contract.ENV_MASTER_ADDR not in environ and not master_port:
        argv += ["--standalone"]
    argv += ["--max-restarts", "0", "-m", "memfit_trainer.cli", "train", "--plan", str(plan_path), *extra]
    return argv


def exit_code_for(child_code: int, message: Mapping[str, object] | None) -> int:
    """The pod's exit code: from the workers' termination message when there is one."""
    if message is not None:
        try:
            return exit_code(Reason(str(message.get("reason"))))
        except ValueError:
            pass
    return child_code


def launch(plan: Plan, *, plan_path: Path, extra: list[str], environ: Mapping[str, str]) -> int:
    """Run torchrun for this node, forward SIGTERM/SIGINT to it, and map its exit code."""
    argv = torchrun_argv(plan, plan_path=plan_path, extra=extra, environ=environ)
    child = subprocess.Popen(argv, env=dict(environ))

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    path = termination_path(dict(environ))
    message = read_termination_message(path)
    if code != 0 and message is None:
        write_termination_message(
            TerminationMessage(reason=Reason.TRAINING_ERROR, message=f"torchrun exited with code {code}"),
            path,
        )
        message = read_termination_message(path)
    return exit_code_for(code, message) if code != 0 else 0

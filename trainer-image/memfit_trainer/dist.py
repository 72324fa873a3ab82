"""Distributed environment from torchrun (or the pod) and process-group setup."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memfit.api import pod as contract

if TYPE_CHECKING:  # torch is imported inside the functions: `memfit-trainer` refuses bad plans without it
    import torch

# Node rank, in order of preference: torchrun's GROUP_RANK, the PET_ flag torchrun reads, the
# classic NODE_RANK, and the Indexed Job's completion index (kubernetes.io/docs/tasks/job/indexed-parallel-processing-static).
NODE_RANK_VARIABLES = ("GROUP_RANK", contract.ENV_TORCHRUN_NODE_RANK, "NODE_RANK", "JOB_COMPLETION_INDEX")


@dataclass(frozen=True, slots=True)
class DistEnv:
    """One process's place in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    under_launcher: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def node_rank_from_env(environ: Mapping[str, str]) -> int:
    """The node index: GROUP_RANK, PET_NODE_RANK, NODE_RANK or JOB_COMPLETION_INDEX (first set), else 0."""
    for name in NODE_RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def under_launcher(environ: Mapping[str, str]) -> bool:
    """True when torchrun (torch.distributed.run) started this process."""
    return "LOCAL_RANK" in environ and "WORLD_SIZE" in environ


def read_dist_env(environ: Mapping[str, str]) -> DistEnv:
    """Rank, world size and rendezvous address from the torchrun environment (single process if absent)."""
    launched = under_launcher(environ)
    return DistEnv(
        rank=int(environ.get("RANK", "0")),
        local_rank=int(environ.get("LOCAL_RANK", "0")),
        world_size=int(environ.get("WORLD_SIZE", "1")),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", environ.get("WORLD_SIZE", "1"))),
        node_rank=node_rank_from_env(environ),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(environ.get("MASTER_PORT", "0") or 0),
        under_launcher=launched,
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def select_device(env: DistEnv, environ: Mapping[str, str]) -> torch.device:
    """cuda:<local rank> when a GPU is visible (unless MEMFIT_DEVICE=cpu), else cpu."""
    import torch

    wanted = environ.get(contract.ENV_DEVICE, "").strip().lower()
    if wanted != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """nccl on GPUs, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(env: DistEnv, device: torch.device) -> None:
    """Join the process group (env:// rendezvous); a single process gets a private port on 127.0.0.1."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if not env.under_launcher:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if not os.environ.get("MASTER_PORT"):
            os.environ["MASTER_PORT"] = str(free_port())
        # One process needs no rendezvous: an in-memory store binds no port, so parallel runs cannot
        # collide on the port picked above (which stays in the env for libraries that read it).
        dist.init_process_group(
            backend=backend_for(device),
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            device_id=device if device.type == "cuda" else None,
        )
        return
    dist.init_process_group(
        backend=backend_for(device),
        rank=env.rank,
        world_size=env.world_size,
        device_id=device if device.type == "cuda" else None,
    )


def barrier() -> None:
    """A barrier when a process group exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def all_reduce_max(value: float) -> float:
    """The maximum of a value over all ranks."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def all_gather_float(value: float) -> list[float]:
    """One value from every rank, in rank order (a sum of one-hot vectors: works on gloo and NCCL)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    tensor = torch.zeros(dist.get_world_size(), dtype=torch.float64, device=_collective_device())
    tensor[dist.get_rank()] = value
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.tolist()]


def all_reduce_mean(value: float) -> float:
    """The mean of a value over all ranks."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / dist.get_world_size()


def _collective_device() -> torch.device:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

"""One rank of a 2-pod Indexed Job: gloo all_reduce of rank+1, the result written to argv[1]."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    os.environ.setdefault("RANK", os.environ.get("JOB_COMPLETION_INDEX", "0"))  # plain env:// launch
    dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the env
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    with open(sys.argv[1], "w") as f:
        f.write(f"rank={rank} world={world} sum={t.item():g} master={os.environ['MASTER_ADDR']}")


if __name__ == "__main__":
    main()

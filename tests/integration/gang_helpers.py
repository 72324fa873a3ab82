"""What the multi-node recovery tests share (test_gang_restart.py, test_node_loss.py): a pool of two KWOK
nodes on which a 2-node plan is the fastest, and the final loss of an uninterrupted run of the same samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed.cluster_helpers import Kube

POOL = "gang-t4"
# The t4-spot KWOK nodes as a pool whose "GPU" is slow (0.5 GB/s of memory bandwidth: the tiny GPT is
# otherwise bound by kernel launches, where a second GPU cannot shorten a step) and whose network is fast:
# two nodes are the fastest plan (objective: time).
GANG_POOL = {
    "apiVersion": "memfit.dev/v1alpha1", "kind": "GPUNodePool", "metadata": {"name": POOL},
    "spec": {"gpu": {"product": "Tesla-T4", "memoryMiB": 15360, "perNode": 1, "memoryBandwidthGBps": 0.5},
             "nodeSelector": {"memfit.dev/pool": "t4-spot"},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
             "pricePerNodeHour": 0.22, "capacityType": "on-demand", "maxNodes": 2,
             "interconnect": {"intraNode": "nvlink", "interNodeGbps": 3200}}}  # fmt: skip



@pytest.fixture
def gang_pool(kube: Kube) -> Iterator[None]:
    """The pool exists only for this test: other modules' jobs must not plan onto it."""
    custom = client.CustomObjectsApi(kube.api_client)
    custom.create_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools", GANG_POOL)
    try:
        yield
    finally:
        custom.delete_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools", POOL)


def terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = pod["status"].get("containerStatuses") or []
    return statuses[0].get("state", {}).get("terminated") if statuses else None


def uninterrupted_final_loss(plan: dict[str, Any], tmp: Path) -> float:
    """The attempt's plan at world size 1 with the same global batch, trained from scratch by the trainer's
    CLI in a subprocess (gloo, CPU)."""
    accumulation = plan["gradientAccumulationSteps"] * plan["nodes"] * plan["gpusPerNode"]
    one = {**plan, "nodes": 1, "gpusPerNode": 1, "gradientAccumulationSteps": accumulation, "attempt": 0}
    one.pop("checkpointDir", None)
    path = tmp / "plan.json"
    path.write_text(json.dumps(one))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MEMFIT_", "PET_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    termination = tmp / "termination-log"
    env |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MEMFIT_TERMINATION_MESSAGE_PATH": str(termination),
            "MEMFIT_CHECKPOINT_DIR": str(tmp / "ckpt")}
    proc = subprocess.run([sys.executable, "-m", "memfit_trainer.cli", "train", "--plan", str(path)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    loss = json.loads(termination.read_text())["finalLoss"]
    assert isinstance(loss, float)
    return loss

"""Run many plans in one torchrun launch (amortises interpreter and DeepSpeed start-up).

Usage: python -m torch.distributed.run --nproc-per-node N matrix_worker.py CASES.json OUT_DIR
CASES.json: [{"id": ..., "plan": <Plan wire JSON>}]; writes OUT_DIR/<id>/rank-<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
from memfit.api.plan import Plan
from memfit_trainer import dist as mdist
from memfit_trainer.train import TrainOptions, run_training


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    torch.set_num_threads(1)
    env = mdist.read_dist_env(os.environ)
    device = torch.device("cpu")
    mdist.init_distributed(env, device)
    for case in cases:
        target = out / case["id"]
        target.mkdir(parents=True, exist_ok=True)
        try:
            result = run_training(
                Plan.model_validate(case["plan"]), env=env, device=device, options=TrainOptions()
            )
            payload = asdict(result)
        except Exception as error:
            payload = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        (target / f"rank-{env.rank}.json").write_text(json.dumps(payload))
        mdist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the test bed finds the checkout's files (KWOK configs, examples, CRDs): it runs from the source tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HACK = Path(__file__).resolve().parents[1]
REPO = HACK.parent
KWOK = HACK / "kwok"


def testbin_dir(flag: str, env: str) -> Path:
    """A folder hack/install-testbin.sh builds into: $`env` when set, else what the script prints for
    `flag` (--print-dir: the control plane; --print-node-dir: the real node's; --print-kueue-dir: Kueue)."""
    if override := os.environ.get(env):
        return Path(override)
    out = subprocess.run(["bash", str(HACK / "install-testbin.sh"), flag], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())

"""memfit's API in a test cluster: the CRDs of crds/ (server-side apply, then Established) and the
GPUNodePools of hack/kwok/gpunodepools.yaml, whose names and selectors match the KWOK pools and the real
node. `hack/testcluster up` and the real-node tier's fixture both install them with `install_memfit_api`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from memfit_testbed.paths import KWOK, REPO

CRDS = REPO / "crds"
POOLS_FILE = KWOK / "gpunodepools.yaml"


class ApiInstallError(RuntimeError):
    """A kubectl step of the install failed (its stderr is the message)."""


def install_commands(*, pools: bool = True) -> list[list[str]]:
    """The kubectl commands, in order (docs/realnode.md shows the same by hand)."""
    cmds = [["kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(CRDS)],
            ["kubectl", "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS)]]
    if pools:
        cmds.append(["kubectl", "apply", "-f", str(POOLS_FILE)])
    return cmds


def install_memfit_api(kubeconfig: Path, *, pools: bool = True) -> None:
    """Apply the CRDs, wait until they are Established, apply the GPUNodePools (idempotent)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    for cmd in install_commands(pools=pools):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ApiInstallError(f"{' '.join(cmd)}: {result.stderr.strip()}")

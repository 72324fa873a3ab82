"""Claims for a user's models, data and output in the test cluster (`hack/testcluster claims`).

On a cluster with the real node, each claim is bound to a hostPath PersistentVolume on that node
(`realnode.volumes`): the containers see what is written into the folder. Without one, the claim takes the
provisioner's default StorageClass `memfit-local`, whose folder under `DIR/pod-runner/claims/` the local
pod runner mounts. Either way the folder is on this machine, so files can be copied in before a job runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit_testbed.realnode.node import NODE_NAME

FINETUNE_CLAIMS = ("models", "corpus")  # what examples/finetune-tiny.yaml names


class ClaimError(RuntimeError):
    """A claim could not be made or did not bind."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A bound claim and the host folder its pods see."""

    namespace: str
    name: str
    folder: Path
    where: str  # "real node memfit-real-0" or "pod runner"


def real_node_name(api: Any) -> str | None:
    """The real node's name when it has joined this cluster (None for a KWOK-and-pod-runner cluster)."""
    from kubernetes.client.exceptions import ApiException

    try:
        api.read_node(NODE_NAME)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return NODE_NAME


def ensure_claims(api: Any, *, workdir: Path, namespace: str, names: tuple[str, ...], size: str = "1Gi",
                  timeout_seconds: float = 60.0) -> list[Claim]:
    """Create each claim (kept when it exists) and wait until it is Bound; `api` is a CoreV1Api."""
    node = real_node_name(api)
    made = []
    for name in names:
        if node:
            from memfit_testbed.realnode.volumes import ensure_local_volume

            folder = ensure_local_volume(api, namespace=namespace, claim=name, node_name=node, size=size)
            where = f"real node {node}"
        else:
            _ensure_default_class_claim(api, namespace=namespace, claim=name, size=size)
            folder = workdir / "pod-runner" / "claims" / namespace / name
            where = "pod runner"
        _wait_bound(api, namespace, name, timeout_seconds)
        made.append(Claim(namespace=namespace, name=name, folder=folder, where=where))
    return made


def delete_claims(api: Any, *, namespace: str, names: tuple[str, ...]) -> None:
    """Delete the claims (and, on the real node, their volumes and folders); absent ones are fine."""
    from kubernetes.client.exceptions import ApiException

    from memfit_testbed.realnode.volumes import delete_local_volume

    node = real_node_name(api)
    for name in names:
        if node:
            delete_local_volume(api, namespace=namespace, claim=name)
            continue
        try:  # the provisioner deletes the Released volume and its folder
            api.delete_namespaced_persistent_volume_claim(name, namespace)
        except ApiException as e:
            if e.status != 404:
                raise


def fill_finetune_claims(claims: list[Claim]) -> None:
    """Write examples/finetune-tiny.yaml's inputs into the claims `models` and `corpus`."""
    from memfit_testbed.finetune_data import write_example_claims

    by_name = {c.name: c.folder for c in claims}
    if missing := [n for n in FINETUNE_CLAIMS if n not in by_name]:
        raise ClaimError(f"--finetune-data writes into the claims {', '.join(FINETUNE_CLAIMS)}: "
                         f"{', '.join(missing)} not given")
    write_example_claims(by_name["models"], by_name["corpus"])


def _ensure_default_class_claim(api: Any, *, namespace: str, claim: str, size: str) -> None:
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}}
    try:
        api.create_namespaced_persistent_volume_claim(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise


def _wait_bound(api: Any, namespace: str, claim: str, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    phase = None
    while time.monotonic() < deadline:
        phase = api.read_namespaced_persistent_volume_claim(claim, namespace).status.phase
        if phase == "Bound":
            return
        time.sleep(0.3)
    raise ClaimError(f"claim {namespace}/{claim} is {phase}, not Bound, after {timeout_seconds:.0f}s "
                     "(is the test cluster's provisioner running? `hack/testcluster status`)")

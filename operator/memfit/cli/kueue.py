"""`memfit kueue flavors`: a ResourceFlavor per GPUNodePool plus an example ClusterQueue and LocalQueue."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from memfit.api.pool import GPUNodePool
from memfit.cli.inputs import InputError, load_pools
from memfit.kube.kueue import KueueConfigError, build_kueue_setup, device_class_mappings


def register(sub: Any) -> None:
    kueue = sub.add_parser("kueue", help="Kueue helpers (docs/kueue.md)")
    kueue_sub = kueue.add_subparsers(dest="kueue_command", required=True)
    flavors = kueue_sub.add_parser(
        "flavors",
        help="print a ResourceFlavor per GPUNodePool and an example ClusterQueue/LocalQueue",
        description="ResourceFlavor <pool> (nodeLabels = the pool's nodeSelector, its tolerations) for each "
        "pool, then a ClusterQueue with a GPU quota per flavor and a LocalQueue. Pools come from the files "
        "given, else from the cluster (the current kubeconfig).",
    )
    flavors.add_argument("files", nargs="*", type=Path, help="GPUNodePool YAML files (default: read the cluster)")
    flavors.add_argument("--cluster-queue", default="memfit", help="ClusterQueue name (default memfit)")
    flavors.add_argument("--local-queue", default="memfit", help="LocalQueue name (default memfit)")
    flavors.add_argument("--namespace", "-n", default="default", help="LocalQueue namespace (default default)")
    flavors.add_argument(
        "--gpu-quota",
        action="append",
        default=[],
        metavar="POOL=GPUS",
        help="nominal quota of a pool's flavor in the resource its pods request: GPUs, or a MIG pool's "
        "slices (repeatable; default every device the pool can have)",
    )
    flavors.add_argument("--out", default="-", help="output file (default stdout)")
    flavors.set_defaults(func=cmd_kueue_flavors)


def _quota(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        pool, sep, value = item.partition("=")
        if not sep or not pool or not value.strip().isdigit():
            raise InputError([f"--gpu-quota {item!r}: expected POOL=GPUS with a whole number of GPUs, e.g. t4-spot=2"])
        out[pool] = int(value)
    return out


def _cluster_pools() -> list[GPUNodePool]:
    from kubernetes import client

    from memfit.cli.cluster import _load_kube_config

    _load_kube_config()
    listed: Any = client.CustomObjectsApi().list_cluster_custom_object("memfit.dev", "v1alpha1", "gpunodepools")
    return [GPUNodePool.model_validate(item) for item in listed["items"]]


def cmd_kueue_flavors(args: argparse.Namespace) -> int:
    try:
        quota = _quota(args.gpu_quota)
        pools: list[GPUNodePool] = []
        for path in args.files:
            found, rejected = load_pools(path)
            if rejected:
                raise InputError([f"{r.pool}: {r.reason}" for r in rejected])
            pools.extend(found)
        if not args.files:
            pools = _cluster_pools()
        docs = build_kueue_setup(pools, cluster_queue=args.cluster_queue, local_queue=args.local_queue,
                                 namespace=args.namespace, gpu_quota=quota)
        mappings = device_class_mappings(pools)
    except InputError as error:
        return error.report()
    except KueueConfigError as error:
        return InputError([str(error)]).report()
    text = yaml.safe_dump_all(docs, sort_keys=False)
    if mappings:  # Kueue's own Configuration, not an object to apply: a comment ahead of the objects
        fragment = yaml.safe_dump({"resources": {"deviceClassMappings": mappings}}, sort_keys=False)
        text = ("# DRA pools: Kueue charges their devices to these resources only with this in its Configuration\n"
                "# (the kueue-manager-config ConfigMap; docs/dra.md):\n"
                + "".join(f"#   {line}\n" for line in fragment.splitlines()) + text)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
    print(f"{len(docs) - 2} ResourceFlavor(s), ClusterQueue {args.cluster_queue}, "
          f"LocalQueue {args.namespace}/{args.local_queue}", file=sys.stderr)
    return 0

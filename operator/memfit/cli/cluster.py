"""`memfit operator` (run the controller) and `memfit pools discover` (pools from node labels)."""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
from typing import Any

import yaml


def register(sub: Any) -> None:
    op = sub.add_parser("operator", help="run the memfit operator (kopf) against the current cluster")
    op.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: cluster-wide",
    )
    op.add_argument("--metrics-host", default="0.0.0.0", help="bind address of /metrics and /healthz")
    op.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics and /healthz (0: off)")
    op.add_argument("--trainer-image", default=None, help="default trainer image (env MEMFIT_TRAINER_IMAGE)")
    op.add_argument(
        "--extra-pod-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label added to every profiling/training pod (repeatable)",
    )
    op.add_argument("--resync-seconds", type=float, default=5.0, help="re-check unfinished jobs this often")
    op.add_argument("--checkpoint-storage-class", default=None,
                    help="StorageClass of the checkpoint claims memfit creates (env MEMFIT_CHECKPOINT_STORAGE_CLASS; "
                    "empty = the cluster default)")  # fmt: skip
    op.add_argument("--checkpoint-access-mode", default=None, choices=("ReadWriteOnce", "ReadWriteMany"),
                    help="access mode of those claims (env MEMFIT_CHECKPOINT_ACCESS_MODE)")
    op.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    op.set_defaults(func=cmd_operator)

    pools = sub.add_parser("pools", help="GPUNodePool helpers")
    pools_sub = pools.add_subparsers(dest="pools_command", required=True)
    discover = pools_sub.add_parser("discover", help="write GPUNodePools from the nodes' GFD labels")
    discover.add_argument("--out", default="-", help="output file (default stdout)")
    discover.set_defaults(func=cmd_pools_discover)


def _load_kube_config() -> None:
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf

    from memfit import metrics
    from memfit.controller import handlers
    from memfit.controller.kopf_json import decode_watch_events_with_orjson
    from memfit.controller.kubeapi import KubeApi
    from memfit.controller.settings import OperatorSettings

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    labels = dict(item.split("=", 1) for item in args.extra_pod_label if "=" in item)
    overrides: dict[str, Any] = {
        "namespaces": tuple(args.namespace),
        "requeue_seconds": args.resync_seconds,
    }
    if args.trainer_image:
        overrides["trainer_image"] = args.trainer_image
    if args.checkpoint_storage_class is not None:
        overrides["checkpoint_storage_class"] = args.checkpoint_storage_class
    if args.checkpoint_access_mode is not None:
        overrides["checkpoint_access_mode"] = args.checkpoint_access_mode
    settings = OperatorSettings.from_env(**overrides)
    if labels:
        settings = OperatorSettings.from_env(**overrides, extra_pod_labels=settings.extra_pod_labels | labels)
    _load_kube_config()
    decode_watch_events_with_orjson()
    api = KubeApi.from_client(workers=settings.workers)
    runtime = handlers.Runtime(settings, api)
    if args.metrics_port:
        metrics.serve(args.metrics_host, args.metrics_port, runtime.healthy)
    threading.Thread(
        target=handlers.resync_forever,
        args=(runtime, settings.requeue_seconds),
        name="memfit-resync",
        daemon=True,
    ).start()
    if settings.admission_check_seconds:
        from memfit.controller.admission.controller import MemoryFitController

        threading.Thread(
            target=MemoryFitController(api, post_event=runtime.events.post).run_forever,
            args=(runtime.stop, settings.admission_check_seconds),
            name="memfit-memory-fit",
            daemon=True,
        ).start()
    memo = handlers.runtime_memo(runtime)
    quiet_garbage_collector()
    if args.namespace:
        kopf.run(standalone=True, namespaces=args.namespace, memo=memo)
    else:
        kopf.run(standalone=True, clusterwide=True, memo=memo)
    return 0


def quiet_garbage_collector() -> None:
    """Keep what start-up loaded (modules, schemas, the catalog) out of the cyclic collector's scans, and
    let it run after 20,000 net allocations instead of 700: a pass decodes whole Jobs, pods and MOTJs
    (tens of thousands of short-lived dicts a second at scale), which at the default triggered
    collections that walked the operator's whole heap many times a second. Reference counting still
    frees everything without cycles at once; cycles wait a little longer."""
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)


def cmd_pools_discover(args: argparse.Namespace) -> int:
    from kubernetes import client

    from memfit.kube.discover import discover_pools

    _load_kube_config()
    nodes = client.ApiClient().sanitize_for_serialization(client.CoreV1Api().list_node().items)
    pools = discover_pools(nodes)
    text = yaml.safe_dump_all(pools, sort_keys=False) if pools else ""
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    print(f"discovered {len(pools)} GPUNodePool(s) from node labels", file=sys.stderr)
    return 0 if pools else 1

"""`hack/testcluster`: the local test cluster ready for memfit (docs/testcluster.md, docs/realnode.md).

up [--real-node] [--no-crds]  start the cluster (memfit_testbed.testcluster), install memfit's CRDs and the
                              GPUNodePools of hack/kwok/gpunodepools.yaml, print the next commands
env                           `eval "$(hack/testcluster env)"`: KUBECONFIG, MEMFIT_TESTCLUSTER_DIR, helm on PATH
claims [NAME...]              PersistentVolumeClaims whose folders are on this machine (on the real node
                              when it has joined), `--finetune-data` fills `models` and `corpus`
down | status | logs          as memfit_testbed.testcluster
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from memfit_testbed import testcluster
from memfit_testbed.paths import REPO

OPERATOR_VALUES = "hack/realnode/operator-values.yaml"  # relative to the checkout: the commands run there


def next_steps(*, real_node: bool, crds: bool) -> str:
    """What to run after `up`, as copy-pasteable commands (the same as docs/realnode.md and
    docs/testcluster.md)."""
    lines = ['eval "$(hack/testcluster env)"        # KUBECONFIG, MEMFIT_TESTCLUSTER_DIR, helm on PATH']
    if not crds:
        lines += ["kubectl apply --server-side -f crds/ && kubectl wait --for=condition=Established --timeout=60s -f crds/",
                  "kubectl apply -f hack/kwok/gpunodepools.yaml"]
    lines += ["kubectl get nodes -L memfit.dev/pool,memfit.dev/real-node", "kubectl get gpupool"]
    if real_node:
        lines += [
            "kubectl create namespace memfit-system",
            "kubectl label namespace memfit-system pod-security.kubernetes.io/enforce=restricted",
            "# the operator on the real node (not a KWOK node), with the images built here:",
            "helm install memfit charts/memfit -n memfit-system --wait --timeout 5m \\",
            f"  -f {OPERATOR_VALUES} \\",
            '  -f "$MEMFIT_TESTCLUSTER_DIR/realnode-images.yaml"',
            "helm test memfit -n memfit-system",
            "hack/testcluster claims models corpus --finetune-data   # claims on the real node, filled",
            "kubectl apply -f examples/finetune-tiny.yaml",
            "kubectl wait motj/finetune-tiny --for=jsonpath='{.status.phase}'=Succeeded --timeout=10m",
            "(step by step, with what each command does: docs/realnode.md)",
        ]
    else:
        lines += [
            "# memfit's operator on this host; the local pod runner runs its pods as processes:",
            "$(hack/venv.sh)/bin/memfit operator --extra-pod-label memfit.dev/run-local=true &",
            "kubectl apply -f examples/quickstart.yaml && kubectl get motj -w",
            "(make demo does all of it; the real node: hack/testcluster up --real-node, docs/realnode.md)",
        ]
    return "next:\n" + "\n".join(f"  {line}" for line in lines)


def env_lines(workdir: Path) -> list[str]:
    """The exports of `hack/testcluster env`: the kubeconfig, the cluster folder (so later `hack/testcluster`
    commands and the real node's images file are found) and the test binaries (helm) on PATH."""
    return [f"export KUBECONFIG={workdir / 'kubeconfig'}", f"export MEMFIT_TESTCLUSTER_DIR={workdir}",
            f'export PATH="{testcluster.find_bin_dir()}:$PATH"']


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "env", "status", "logs", "claims"])
    ap.add_argument("names", nargs="*", help="claims: the claims' names (default with --finetune-data: models corpus)")
    ap.add_argument("--dir", type=Path, default=testcluster.DEFAULT_DIR,
                    help=f"cluster folder (default $MEMFIT_TESTCLUSTER_DIR or {testcluster.DEFAULT_DIR})")
    up = ap.add_argument_group("up")
    up.add_argument("--no-pod-runner", action="store_true", help="do not start the local pod runner")
    up.add_argument("--no-pools", action="store_true", help="skip the KWOK nodes of hack/kwok/gpu-pools.yaml")
    up.add_argument("--no-crds", action="store_true",
                    help="skip memfit's CRDs (crds/) and GPUNodePools (hack/kwok/gpunodepools.yaml)")
    up.add_argument("--real-node", action="store_true",
                    help="add a real node (kubelet + containerd) standing in for a GPU pool (docs/realnode.md)")
    up.add_argument("--real-node-pool", default="t4-spot", help="the pool whose KWOK nodes the real node replaces")
    claims = ap.add_argument_group("claims")
    claims.add_argument("-n", "--namespace", default="default", help="the claims' namespace")
    claims.add_argument("--size", default="1Gi", help="each claim's requested size")
    claims.add_argument("--finetune-data", action="store_true",
                        help="write examples/finetune-tiny.yaml's inputs: a tiny pretrained Llama into `models`, "
                             "train.jsonl and eval.jsonl into `corpus`")
    claims.add_argument("--delete", action="store_true", help="delete the claims (and real-node volumes)")
    return ap


def up(args: argparse.Namespace, workdir: Path) -> int:
    flags = [f for f, on in (("--no-pod-runner", args.no_pod_runner), ("--no-pools", args.no_pools),
                             ("--real-node", args.real_node)) if on]
    if args.real_node:
        flags += ["--real-node-pool", args.real_node_pool]
    if rc := testcluster.main(["up", "--dir", str(workdir), *flags]):
        return rc
    if not args.no_crds:
        from memfit_testbed.memfit_api import POOLS_FILE, ApiInstallError, install_memfit_api

        try:
            install_memfit_api(workdir / "kubeconfig", pools=True)
        except ApiInstallError as e:
            print(f"testcluster: installing memfit's CRDs: {e}", file=sys.stderr)
            return 1
        print(f"memfit CRDs installed (crds/), GPUNodePools applied ({POOLS_FILE.relative_to(REPO)})",
              file=sys.stderr)
    if args.real_node:
        print(f"real node images (Helm values): {workdir / 'realnode-images.yaml'}", file=sys.stderr)
    print(next_steps(real_node=args.real_node, crds=not args.no_crds), file=sys.stderr)
    return 0


def claims(args: argparse.Namespace, workdir: Path) -> int:
    from kubernetes import client, config

    from memfit_testbed.claims import (
        FINETUNE_CLAIMS,
        ClaimError,
        delete_claims,
        ensure_claims,
        fill_finetune_claims,
    )

    names = tuple(args.names) or (FINETUNE_CLAIMS if args.finetune_data else ())
    if not names:
        print("testcluster claims: name at least one claim (or --finetune-data)", file=sys.stderr)
        return 2
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(workdir / "kubeconfig")))
    if args.delete:
        delete_claims(api, namespace=args.namespace, names=names)
        print(f"deleted claims {', '.join(names)} in {args.namespace}", file=sys.stderr)
        return 0
    try:
        made = ensure_claims(api, workdir=workdir, namespace=args.namespace, names=names, size=args.size)
        if args.finetune_data:
            fill_finetune_claims(made)
    except ClaimError as e:
        print(f"testcluster claims: {e}", file=sys.stderr)
        return 1
    for claim in made:
        print(f"claim {claim.namespace}/{claim.name} Bound ({claim.where}): folder {claim.folder}", file=sys.stderr)
    if args.finetune_data:
        print("wrote models/tiny-llama (model + tokenizer), corpus/train.jsonl, corpus/eval.jsonl: "
              "kubectl apply -f examples/finetune-tiny.yaml", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    workdir = args.dir.resolve()
    if args.names and args.command != "claims":
        parser().error(f"{args.command} takes no names")
    if args.command == "up":
        return up(args, workdir)
    if args.command == "env":
        print("\n".join(env_lines(workdir)))
        return 0
    if args.command == "claims":
        return claims(args, workdir)
    return testcluster.main([args.command, "--dir", str(workdir)])


if __name__ == "__main__":
    sys.exit(main())

"""docs/realnode.md, "Step by step", followed literally: its marked ```bash blocks run in order against the
session's real-node cluster (Helm install onto the real node, claims, the fine-tune to Succeeded), then its
clean-up blocks. A doc that leads the operator onto a KWOK node, or a command that no longer works, fails
here.

Markers (HTML comments, invisible when rendered) before a block:
- `<!-- test_docs_realnode: fixture -->`: what the session fixture does instead (start, stop the cluster);
- `<!-- test_docs_realnode: run -->`: run, in document order, in one bash with `set -euo pipefail`;
- `<!-- test_docs_realnode: cleanup -->`: run at the end, also after a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from memfit_testbed import testcluster
from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.realnode.node import NODE_IP, RealNode
from memfit_testbed.realnode.volumes import volume_folder

pytestmark = [pytest.mark.realnode, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "realnode.md"
BLOCK = re.compile(r"^<!-- test_docs_realnode: (\w+) -->\n```bash\n(.*?)^```", re.M | re.S)
JOB, JOB_NS, OPERATOR_NS = "finetune-tiny", "default", "memfit-system"
TIMEOUT_SECONDS = 900


def doc_blocks() -> list[tuple[str, int, str]]:
    """(marker, line, text) of every marked block of the doc, in order."""
    text = DOC.read_text()
    return [(m[1], text.count("\n", 0, m.start()) + 2, m[2]) for m in BLOCK.finditer(text)]


def script(blocks: list[tuple[str, int, str]], *, strict: bool) -> str:
    """One bash script of the blocks: `strict` stops at the first failing command; otherwise every command
    runs and the exit status says whether any failed."""
    head = "set -euo pipefail" if strict else "set -uo pipefail\nstatus=0\ntrap 'status=1' ERR"
    parts = [f"echo '### docs/realnode.md line {line}'\nset -x\n{text}set +x" for _, line, text in blocks]
    return head + "\n" + "\n".join(parts) + "\n" + ("" if strict else "exit $status\n")


def test_the_doc_marks_its_blocks() -> None:
    markers = [m for m, _, _ in doc_blocks()]
    assert markers.count("run") >= 4 and "cleanup" in markers, markers
    fixture = "".join(t for m, _, t in doc_blocks() if m == "fixture")
    # The session fixture (conftest.real_cluster + rcrds) stands in for exactly these.
    assert "hack/testcluster up --real-node" in fixture and "hack/testcluster down" in fixture, fixture


def run_watching(cmd: list[str], *, env: dict[str, str], kube: Kube, log: Path
                 ) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    """Run the doc's script, remembering every pod of the job and of the operator as last seen (memfit
    deletes a finished attempt's Job with its pods); stop it early when the job Failed."""
    custom = client.CustomObjectsApi(kube.api_client)
    seen: dict[str, dict[str, Any]] = {}
    job: dict[str, Any] = {}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while True:
            ended = proc.poll() is not None  # then this is the last look, taken after the script's end
            for pod in kube.pods(JOB_NS, f"memfit.dev/job={JOB}") + kube.pods(OPERATOR_NS):
                seen[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = pod
            job = kube.raw(custom.get_namespaced_custom_object, "memfit.dev", "v1alpha1", JOB_NS,
                           "memoryoptimizedtrainingjobs", JOB) or {}
            if ended or (job.get("status") or {}).get("phase") == "Failed" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if proc.poll() is None:
            proc.terminate()
        rc = proc.wait(timeout=30)
    return rc, seen, job


def container_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def test_the_step_by_step_of_docs_realnode_reaches_succeeded(
        real_cluster: tuple[testcluster.TestCluster, RealNode], rkube: Kube, rnode: RealNode, rcrds: None,
        tmp_path: Path) -> None:
    cluster, _ = real_cluster
    blocks = doc_blocks()
    env = {**os.environ, "MEMFIT_PYTHON": sys.executable, "MEMFIT_TESTCLUSTER_DIR": str(cluster.workdir),
           # Also what the doc's `eval "$(hack/testcluster env)"` exports, so the clean-up (another bash)
           # reaches this cluster and its helm even when the run stopped before that line.
           "KUBECONFIG": str(cluster.kubeconfig),
           "PATH": f"{testcluster.find_bin_dir()}:{os.environ['PATH']}",
           **{f"HELM_{k}_HOME": str(tmp_path / "helm") for k in ("CACHE", "CONFIG", "DATA")}}
    log = tmp_path / "run.log"
    failed = True
    try:
        rc, seen, job = run_watching(["bash", "-c", script([b for b in blocks if b[0] == "run"], strict=True)],
                                     env=env, kube=rkube, log=log)
        output = log.read_text(errors="replace")
        assert rc == 0, f"the doc's commands failed (exit {rc}); job status {job.get('status')}:\n{output[-6000:]}"
        assert (job.get("status") or {}).get("phase") == "Succeeded", job.get("status")
        # The operator ran in a container on the real node: the doc's values kept it off the KWOK nodes.
        operators = [p for k, p in seen.items() if k.startswith(f"{OPERATOR_NS}/memfit-")
                     and "-test-" not in k]
        assert operators, sorted(seen)
        for pod in operators:
            assert pod["spec"]["nodeName"] == rnode.node_name and pod["status"].get("hostIP") == NODE_IP, pod["spec"]
            assert container_state(pod).get("containerID", "").startswith("containerd://")
        # The job's profiling and training pods ran as containers of the trainer image on the real node.
        pods = [p for k, p in seen.items() if k.startswith(f"{JOB_NS}/")]
        names = sorted(p["metadata"]["name"] for p in pods)
        assert any("-profile" in n for n in names) and any("-train-" in n for n in names), names
        assert rnode.images is not None
        for pod in pods:
            assert pod["spec"].get("nodeName") == rnode.node_name, (pod["metadata"]["name"], pod["spec"])
            assert pod["spec"]["containers"][0]["image"] == rnode.images.trainer, pod["spec"]["containers"][0]
        assert any(container_state(p).get("containerID", "").startswith("containerd://") for p in pods), pods
        # The fine-tuned model is on the `models` claim's folder on the node, and it learned.
        summary = json.loads((volume_folder(JOB_NS, "models") / "out" / "tiny-llama-ft" /
                              "memfit_training.json").read_text())
        assert summary["final_eval_loss"] < summary["initial_eval_loss"], summary
        assert "Succeeded" in output and "memfit-real-0" in output, output[-3000:]
        failed = False
    finally:
        cleanup = subprocess.run(["bash", "-c", script([b for b in blocks if b[0] == "cleanup"], strict=False)],
                                 cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        left = rkube.raw(rkube.core.read_namespace, OPERATOR_NS)
        claim_left = rkube.raw(rkube.core.read_namespaced_persistent_volume_claim, "models", JOB_NS)
        if left:  # the next module installs the chart into the same namespace
            rkube.core.delete_namespace(OPERATOR_NS)
            rkube.wait(f"namespace {OPERATOR_NS} gone", lambda: not rkube.raw(rkube.core.read_namespace,
                                                                              OPERATOR_NS), timeout=120)
        if not failed:
            assert cleanup.returncode == 0, cleanup.stdout[-3000:] + cleanup.stderr[-3000:]
            assert not left, f"the doc's clean-up left namespace {OPERATOR_NS}"
            assert not claim_left, "the doc's clean-up left the claim `models`"

"""The real node's pure helpers: image tags from input hashes, image names as containerd stores them,
the node's labels from its pool, the Helm values naming its images and placing the operator on it, its
hostPath volumes (docs/realnode.md). The node itself is tested in tests/realnode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from memfit_testbed.paths import REPO
from memfit_testbed.realnode import images, volumes
from memfit_testbed.realnode.node import RealNode


def test_digest_follows_contents_and_names_but_not_caches(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    first = images.digest_paths(tmp_path, ["pkg"], "arg=1")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert images.digest_paths(tmp_path, ["pkg"], "arg=1") == first
    assert images.digest_paths(tmp_path, ["pkg"], "arg=2") != first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    changed = images.digest_paths(tmp_path, ["pkg"], "arg=1")
    assert changed != first
    (tmp_path / "pkg" / "a.py").rename(tmp_path / "pkg" / "b.py")
    assert images.digest_paths(tmp_path, ["pkg"], "arg=1") != changed


@pytest.mark.parametrize(("ref", "stored"), [
    ("memfit/trainer:test-1", "docker.io/memfit/trainer:test-1"),
    ("registry.k8s.io/pause:3.6", "registry.k8s.io/pause:3.6"),
    ("busybox:1", "docker.io/library/busybox:1"),
    ("localhost:5000/x:1", "localhost:5000/x:1"),
])
def test_normalize_matches_containerd(ref: str, stored: str) -> None:
    assert images.normalize(ref) == stored


def test_every_dockerfile_image_hashes_its_dockerfile_and_constraints() -> None:
    for role, (dockerfile, _, paths, _) in images.DOCKERFILE_IMAGES.items():
        assert dockerfile in paths and "constraints.txt" in paths, role


def test_node_labels_are_the_pools_with_the_real_gpu_count() -> None:
    labels = dict(kv.split("=", 1) for kv in RealNode(cluster_dir=Path("/x"), apiserver_port=1)._labels().split(","))
    assert labels["memfit.dev/pool"] == "t4-spot"
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["memfit.dev/real-node"] == "true"
    assert "type" not in labels and "kubernetes.io/hostname" not in labels


def test_readme_is_a_stub_in_the_image_hash(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("one\n")
    first = images.digest_paths(tmp_path, ["README.md"])
    (tmp_path / "README.md").write_text("two\n")
    assert images.digest_paths(tmp_path, ["README.md"]) == first


@pytest.mark.parametrize(("operator", "trainer", "values"), [
    ("memfit/operator:test-1", "memfit/trainer:test-2",
     {"image": {"repository": "memfit/operator", "tag": "test-1"},
      "trainer": {"image": {"repository": "memfit/trainer", "tag": "test-2"}}}),
    ("localhost:5000/op:v1", "localhost:5000/tr:v2",
     {"image": {"repository": "localhost:5000/op", "tag": "v1"},
      "trainer": {"image": {"repository": "localhost:5000/tr", "tag": "v2"}}}),
], ids=["test tags", "registry with a port"])
def test_helm_values_name_the_node_images(operator: str, trainer: str, values: dict[str, object]) -> None:
    imgs = images.Images(base="b", pause="p", operator=operator, trainer=trainer)
    assert imgs.helm_values() == values


def test_operator_values_select_the_real_node_and_tolerate_its_taint() -> None:
    """hack/realnode/operator-values.yaml matches what the node registers with (its label and its taint)."""
    values = yaml.safe_load((REPO / "hack" / "realnode" / "operator-values.yaml").read_text())
    labels = dict(kv.split("=", 1) for kv in RealNode(cluster_dir=Path("/x"), apiserver_port=1)._labels().split(","))
    assert values["operator"]["nodeSelector"].items() <= labels.items()
    assert values["operator"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert values["crds"] == {"enabled": False}  # hack/testcluster up applies crds/ server-side


def test_local_volume_is_a_hostpath_pinned_to_the_node_and_prebound_to_its_claim() -> None:
    pv, pvc = volumes.build_local_volume(namespace="ml", claim="models", node_name="memfit-real-0", size="2Gi")
    assert pv["metadata"]["name"] == "ml-models" == pvc["spec"]["volumeName"]
    assert pv["spec"]["hostPath"] == {"path": "/var/lib/memfit-kubelet/volumes-local/ml-models", "type": "Directory"}
    assert pv["spec"]["claimRef"] == {"namespace": "ml", "name": "models"}
    term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "kubernetes.io/hostname", "operator": "In", "values": ["memfit-real-0"]}
    # storageClassName "" on both: the default StorageClass (the test bed's provisioner) stays out.
    assert pv["spec"]["storageClassName"] == "" == pvc["spec"]["storageClassName"]
    assert pv["spec"]["capacity"]["storage"] == "2Gi" == pvc["spec"]["resources"]["requests"]["storage"]


def test_a_changed_base_recipe_makes_the_recorded_images_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator and trainer tags hash the base they were built on, so the recorded set must also be
    checked against the base the recipe makes now: adding a package to the base rebuilds everything."""
    recorded = {"base": images.base_tag()}
    for role, (_, base_arg, paths, fixed) in images.DOCKERFILE_IMAGES.items():
        args = {base_arg: recorded["base"], **fixed}
        recorded[role] = f"memfit/{role}:test-" + images.digest_paths(
            REPO, paths, json.dumps(args, sort_keys=True))[:16]
    assert images._recorded_is_current(recorded)
    monkeypatch.setattr(images, "BASE_PACKAGES", (*images.BASE_PACKAGES, "another-package"))
    assert not images._recorded_is_current(recorded)

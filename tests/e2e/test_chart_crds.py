"""The chart's CRDs are the files `memfit crds` generates (crds/), byte for byte and as rendered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from e2e_chart import helm_template
from e2e_tools import CHART, REPO

CHART_CRDS = CHART / "files" / "crds"
SYNC = f"{Path(sys.executable).parent / 'memfit'} crds --out charts/memfit/files/crds"


def test_chart_crd_files_match_crds_folder() -> None:
    repo = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    chart = sorted(p.name for p in CHART_CRDS.glob("*.yaml"))
    assert chart == repo, f"run `{SYNC}`"
    for name in repo:
        assert (CHART_CRDS / name).read_text() == (REPO / "crds" / name).read_text(), f"{name}: run `{SYNC}`"


def test_chart_crd_files_match_the_models() -> None:
    result = subprocess.run([sys.executable, "-m", "memfit.cli", "crds", "--check", "--out", str(CHART_CRDS)],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, f"{result.stderr}\nrun `{SYNC}`"


def _without_chart_metadata(crd: dict[str, object]) -> dict[str, object]:
    meta = dict(crd["metadata"])  # type: ignore[arg-type]
    meta.pop("labels", None)
    meta.pop("annotations", None)
    return {**crd, "metadata": meta}


def test_rendered_crds_equal_the_generated_ones_plus_labels_and_keep(helm: Path) -> None:
    rendered, _ = helm_template(helm)
    generated = {d["metadata"]["name"]: d for d in
                 (yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml")))}
    crds = {c["metadata"]["name"]: c for c in rendered.kind("CustomResourceDefinition")}
    assert sorted(crds) == sorted(generated) == ["gpunodepools.memfit.dev",
                                                 "memoryoptimizedtrainingjobs.memfit.dev"]
    for name, crd in crds.items():
        assert _without_chart_metadata(crd) == _without_chart_metadata(generated[name])
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/component"] == "crd"


def test_crds_keep_false_and_disabled(helm: Path) -> None:
    not_kept, _ = helm_template(helm, "--set", "crds.keep=false")
    for crd in not_kept.kind("CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})
    disabled, _ = helm_template(helm, "--set", "crds.enabled=false")
    assert disabled.kind("CustomResourceDefinition") == []
    assert disabled.kind("Deployment")

"""DESIGN §2 dependency rule: pure packages import no kopf, Kubernetes client or torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PURE = [
    "operator/memfit/api",
    "operator/memfit/memory",
    "operator/memfit/planner",
    "operator/memfit/kube",
    "operator/memfit/lifecycle",
    "operator/memfit/catalog.py",
]
FORBIDDEN_IN_PURE = ("kopf", "kubernetes", "torch", "deepspeed", "bitsandbytes", "memfit.controller")
FORBIDDEN_IN_TRAINER = ("memfit.controller", "kopf")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def violations(root: Path, forbidden: tuple[str, ...]) -> list[str]:
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    return [
        f"{f.relative_to(REPO) if f.is_relative_to(REPO) else f}: {m}"
        for f in files
        for m in sorted(imported_modules(f))
        if any(m == bad or m.startswith(bad + ".") for bad in forbidden)
    ]


@pytest.mark.parametrize("package", PURE)
def test_pure_package_imports_nothing_forbidden(package: str) -> None:
    root = REPO / package
    if not root.exists():
        pytest.skip(f"{package} not written yet")
    assert violations(root, FORBIDDEN_IN_PURE) == []


def test_trainer_never_imports_controller() -> None:
    assert violations(REPO / "trainer-image" / "memfit_trainer", FORBIDDEN_IN_TRAINER) == []


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "planner.py"
    bad.write_text("import kopf\nfrom torch.nn import Linear\nfrom memfit.api import Plan\n")
    assert violations(bad, FORBIDDEN_IN_PURE) == [f"{bad}: kopf", f"{bad}: torch.nn"]


@pytest.mark.parametrize("package", ["operator/memfit", "trainer-image/memfit_trainer"])
def test_shipped_packages_never_import_the_test_bed(package: str) -> None:
    # memfit_testbed is dev-only: the images do not contain it (pyproject.toml, hack/memfit_testbed).
    assert violations(REPO / package, ("memfit_testbed",)) == []

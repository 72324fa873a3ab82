"""`hack/testcluster`'s printed next steps: the commands docs/realnode.md and docs/testcluster.md give,
with the values that put the operator on the real node (memfit_testbed.testcluster_cli)."""

from __future__ import annotations

from pathlib import Path

import pytest
from memfit_testbed.paths import REPO
from memfit_testbed.testcluster_cli import OPERATOR_VALUES, env_lines, next_steps

REALNODE_DOC = (REPO / "docs" / "realnode.md").read_text()


def commands(text: str) -> list[str]:
    """The command lines of the printed text, without comments and the heading."""
    return [line.split("  #")[0].strip() for line in text.splitlines()[1:]
            if line.strip() and not line.strip().startswith(("#", "("))]


def test_real_node_steps_are_the_docs_commands_with_the_committed_values() -> None:
    text = next_steps(real_node=True, crds=True)
    assert (REPO / OPERATOR_VALUES).is_file()
    assert f"-f {OPERATOR_VALUES}" in text and '-f "$MEMFIT_TESTCLUSTER_DIR/realnode-images.yaml"' in text
    for line in commands(text):
        assert line in REALNODE_DOC, f"printed but not in docs/realnode.md: {line}"


@pytest.mark.parametrize(("real_node", "crds", "present", "absent"), [
    (False, True, "memfit operator --extra-pod-label memfit.dev/run-local=true", "helm install"),
    (False, False, "kubectl apply --server-side -f crds/", "helm install"),
    (True, True, "hack/testcluster claims models corpus --finetune-data", "kubectl apply --server-side"),
], ids=["pod runner", "pod runner without crds", "real node"])
def test_steps_follow_the_options(real_node: bool, crds: bool, present: str, absent: str) -> None:
    text = next_steps(real_node=real_node, crds=crds)
    assert text.startswith('next:\n  eval "$(hack/testcluster env)"')
    assert present in text and absent not in text


def test_env_exports_the_kubeconfig_the_folder_and_helm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFIT_TESTBIN_DIR", "/bin-dir")
    assert env_lines(Path("/c")) == ["export KUBECONFIG=/c/kubeconfig", "export MEMFIT_TESTCLUSTER_DIR=/c",
                                     'export PATH="/bin-dir:$PATH"']

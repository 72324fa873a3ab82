"""Operator settings from the chart's environment: the pods' fsGroup and its change policy."""

from __future__ import annotations

import pytest
from memfit.controller.settings import OperatorSettings


def test_fs_group_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFIT_POD_FS_GROUP", "2000")
    monkeypatch.setenv("MEMFIT_POD_FS_GROUP_CHANGE_POLICY", "Always")
    settings = OperatorSettings.from_env()
    assert (settings.pod_fs_group, settings.pod_fs_group_change_policy) == (2000, "Always")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("MEMFIT_POD_FS_GROUP", "0", "trainer.fsGroup"),
        ("MEMFIT_POD_FS_GROUP", "staff", "trainer.fsGroup"),
        ("MEMFIT_POD_FS_GROUP_CHANGE_POLICY", "Never", "OnRootMismatch, Always"),
    ],
)
def test_bad_values_name_the_chart_value(monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=says):
        OperatorSettings.from_env()

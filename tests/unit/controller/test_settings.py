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
        ("MEMFIT_WORKERS", "0", r"operator\.workers"),
        ("MEMFIT_WORKERS", "many", r"operator\.workers"),
    ],
)
def test_bad_values_name_the_chart_value(monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=says):
        OperatorSettings.from_env()


def test_workers_default_and_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMFIT_WORKERS", raising=False)
    assert OperatorSettings.from_env().workers == 64
    monkeypatch.setenv("MEMFIT_WORKERS", "8")
    assert OperatorSettings.from_env().workers == 8


def test_every_worker_keeps_its_own_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's pool holds a kept-alive connection for each worker and the loops beside them: a
    smaller pool drops connections whenever more threads are in a request, and re-opens them with a TLS
    handshake."""
    from kubernetes import client
    from memfit.controller.kubeapi import SPARE_CONNECTIONS, KubeApi

    config = client.Configuration()
    config.host = "https://127.0.0.1:6443"
    monkeypatch.setattr(client.Configuration, "get_default_copy", staticmethod(lambda: config))
    api = KubeApi.from_client(workers=100)
    assert api.core.api_client.configuration.connection_pool_maxsize == 100 + SPARE_CONNECTIONS
    assert api.core.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 100 + SPARE_CONNECTIONS

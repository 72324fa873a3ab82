"""Apply hostile specs to the real API server and judge each one (issue 8 §3).

A case passes when the API server rejects it with a message naming the field, or admits it and the
running operator marks it Failed/InvalidSpec naming the field, with no children. Independently, the
operator's own validation is run in-process on every case (as if an older CRD without the CEL rules
had admitted it): that layer must refuse every case that reaches it without creating a child.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from memfit.controller.kubeapi import KubeApi
from memfit.controller.reconcile import reconcile_job
from memfit.controller.settings import OperatorSettings
from memfit.controller.world_cache import World

from memfit_testbed.cluster_helpers import Kube
from memfit_testbed.reliability.chaos import GROUP, MOTJ, VERSION
from memfit_testbed.reliability.hostile_specs import Case

SETTINGS = OperatorSettings(trainer_image="memfit-trainer:test")
TERMINAL = ("Succeeded", "Failed")


class ChildCreated(Exception):
    """The operator tried to create a child for a hostile spec."""


class NoChildrenApi(KubeApi):
    """Stands in for the API server in the in-process check: reads find nothing, a create is recorded
    as a failure, the status patch is kept."""

    def __init__(self) -> None:  # no clients: nothing may reach a cluster
        self.status: dict[str, Any] | None = None

    def get_job(self, namespace: str, name: str) -> None:
        return None

    def get_config_map(self, namespace: str, name: str) -> None:
        return None

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []

    def get_claim(self, namespace: str, name: str) -> None:
        return None

    def trainer_metrics(self, host: str, port: int, *, job: str) -> None:
        return None

    def ensure(self, manifest: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        raise ChildCreated(f"{manifest['kind']} {manifest['metadata']['name']}")

    def delete_job(self, namespace: str, name: str) -> None:
        raise ChildCreated(f"delete Job {name}")

    def replace_config_map_data(self, namespace: str, name: str, data: dict[str, str]) -> None:
        raise ChildCreated(f"patch ConfigMap {name}")

    def patch_motj_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        self.status = status
        return {"metadata": {"resourceVersion": "2"}}

    def create_event(self, event: dict[str, Any]) -> None:
        return None


@dataclass
class Verdict:
    """How the API server and the operator treated one hostile case."""

    case: Case
    api_status: int = 0  # HTTP status of the create (201 admitted)
    api_names_field: bool = False
    operator_invalid: bool = False  # in-process: Failed InvalidSpec naming the field
    operator_children: str = ""  # in-process: the child it tried to create, if any
    admitted_outcome: str = ""  # the running operator's verdict on an admitted case
    admitted_children: int = 0
    message: str = ""

    @property
    def rejected(self) -> bool:
        return 400 <= self.api_status < 500

    @property
    def ok(self) -> bool:
        if self.rejected:
            return self.api_names_field
        return self.admitted_outcome == "InvalidSpec" and self.admitted_children == 0


def field_named(field_path: str, text: str) -> bool:
    """The rejection names the field: `spec.a.b` (API server) or `a.b` (operator messages)."""
    short = field_path.removeprefix("spec.")
    return field_path in text or short in text


def judge_in_process(case: Case, namespace: str) -> tuple[bool, str]:
    """The operator's own verdict, without an API server: (InvalidSpec naming the field, child)."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MemoryOptimizedTrainingJob",
        "metadata": {
            "name": case.doc["metadata"]["name"],
            "namespace": namespace,
            "uid": str(uuid.uuid4()),  # each case is its own object (specs are parsed once per uid + generation)
            "resourceVersion": "1",
            "generation": 1,
        },
        "spec": case.doc.get("spec"),
    }
    api = NoChildrenApi()
    try:
        reconcile_job(api, body, settings=SETTINGS, world=World((), {}))
    except ChildCreated as child:
        return False, str(child)
    status = api.status or {}
    failed = next((c for c in status.get("conditions", []) if c["type"] == "Failed"), {})
    invalid = failed.get("reason") == "InvalidSpec" and field_named(case.field, failed.get("message", ""))
    return invalid, ""


def children_of(kube: Kube, namespace: str, name: str) -> int:
    selector = f"memfit.dev/job={name}"
    jobs = kube.batch.list_namespaced_job(namespace, label_selector=selector).items
    cms = kube.core.list_namespaced_config_map(namespace, label_selector=selector).items
    services = kube.core.list_namespaced_service(namespace, label_selector=selector).items
    return len(jobs) + len(cms) + len(services)


def judge(kube: Kube, namespace: str, case: Case, *, wait_seconds: float = 30.0) -> Verdict:
    """Create the case (strict field validation, as kubectl does) and judge what happens."""
    verdict = Verdict(case)
    verdict.operator_invalid, verdict.operator_children = judge_in_process(case, namespace)
    custom = client.CustomObjectsApi(kube.api_client)
    try:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, MOTJ, case.doc, field_validation="Strict"
        )
        verdict.api_status = 201
    except ApiException as error:
        verdict.api_status = int(error.status or 0)
        body = str(error.body or error.reason)
        verdict.api_names_field = field_named(case.field, body)
        verdict.message = body[:400]
        if not verdict.rejected:
            raise
        return verdict
    name = case.doc["metadata"]["name"]
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, name)
        status = job.get("status") or {}
        if status.get("phase") in TERMINAL:
            failed = next((c for c in status.get("conditions", []) if c["type"] == "Failed"), {})
            named = field_named(case.field, failed.get("message", ""))
            verdict.admitted_outcome = (
                str(failed.get("reason")) if named else f"{failed.get('reason')} (field not named)"
            )
            verdict.message = str(failed.get("message", ""))[:400]
            break
        time.sleep(0.2)
    else:
        verdict.admitted_outcome = "not terminal"
    verdict.admitted_children = children_of(kube, namespace, name)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, MOTJ, name)
    return verdict


@dataclass
class FuzzSummary:
    verdicts: list[Verdict] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        v = self.verdicts
        by_category: dict[str, Counter[str]] = {}
        for x in v:
            key = (
                "rejected by the API server" if x.rejected else "admitted, InvalidSpec" if x.ok else "failed"
            )
            by_category.setdefault(x.case.category, Counter())[key] += 1
        reaching = [x for x in v if x.rejected is False]
        return {
            "specs": len(v),
            "rejected_by_api_server": sum(x.rejected for x in v),
            "rejection_names_the_field": sum(x.rejected and x.api_names_field for x in v),
            "admitted": len(reaching),
            "admitted_marked_invalid_spec_naming_field": sum(
                x.admitted_outcome == "InvalidSpec" for x in reaching
            ),
            "children_created": sum(x.admitted_children for x in v),
            "passed": sum(x.ok for x in v),
            "operator_in_process_invalid_spec": sum(x.operator_invalid for x in v),
            "operator_in_process_children": sum(bool(x.operator_children) for x in v),
            "by_category": {k: dict(c) for k, c in sorted(by_category.items())},
            "failures": [
                f"{x.case.describe()} -> HTTP {x.api_status} {x.admitted_outcome}: {x.message[:200]}"
                for x in v
                if not x.ok
            ][:20],
            "operator_lax": [
                f"{x.case.category} {x.case.field}: {x.operator_children or 'accepted'}"
                for x in v
                if not x.operator_invalid
            ][:20],
        }


def draw_cases(count: int, seed: int) -> list[Case]:
    """`count` hostile cases from hypothesis (named fz-0000...), reproducible by `seed`."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as with_seed
    from hypothesis import strategies as st

    from memfit_testbed.reliability.hostile_specs import hostile_case

    cases: list[Case] = []

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @with_seed(seed)
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        cases.append(data.draw(hostile_case(f"fz-{len(cases):04d}")))

    collect()
    return cases

"""What the operator's RBAC must grant, exactly (issue 7): shared by the render test and the can-i matrix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
Rules = Mapping[tuple[str, str], frozenset[str]]

CRUD_CHILD = frozenset({"create", "get", "list", "watch", "patch", "delete"})
READ = frozenset({"get", "list", "watch"})

NAMESPACED: Rules = {
    ("memfit.dev", "memoryoptimizedtrainingjobs"): READ | {"patch", "update"},
    ("memfit.dev", "memoryoptimizedtrainingjobs/status"): frozenset({"get", "patch", "update"}),
    ("batch", "jobs"): CRUD_CHILD,
    ("", "pods"): READ | {"delete"},
    ("", "services"): CRUD_CHILD,
    ("", "configmaps"): CRUD_CHILD,
    ("", "persistentvolumeclaims"): frozenset({"create", "get"}),  # <job>-checkpoints; deleted by the GC
    ("", "events"): frozenset({"create", "patch"}),
    ("resource.k8s.io", "resourceclaimtemplates"): frozenset({"create", "get"}),  # a DRA pool's, per attempt
}
KUEUE: Rules = {("kueue.x-k8s.io", "workloads"): READ, ("kueue.x-k8s.io", "localqueues"): READ}
KUEUE_CLUSTER: Rules = {("kueue.x-k8s.io", "clusterqueues"): READ}
# The memfit.dev/memory-fit AdmissionCheck controller (kueue.admissionCheck): Workloads of every namespace.
ADMISSION_CHECK: Rules = {
    ("kueue.x-k8s.io", "admissionchecks"): frozenset({"get", "list"}),
    ("kueue.x-k8s.io", "workloads"): frozenset({"get", "list"}),
    ("kueue.x-k8s.io", "admissionchecks/status"): frozenset({"patch"}),
    ("kueue.x-k8s.io", "workloads/status"): frozenset({"patch"}),
    ("kueue.x-k8s.io", "resourceflavors"): frozenset({"get"}),
    ("kueue.x-k8s.io", "clusterqueues"): frozenset({"get"}),
    ("batch", "jobs"): frozenset({"get"}),
    ("", "configmaps"): frozenset({"get"}),
}
CLUSTER: Rules = {
    ("", "nodes"): READ,
    ("memfit.dev", "gpunodepools"): READ | {"patch", "create"},
    ("memfit.dev", "gpunodepools/status"): frozenset({"get", "patch", "update"}),
    ("apiextensions.k8s.io", "customresourcedefinitions"): frozenset({"list", "watch"}),
    ("", "namespaces"): frozenset({"list", "watch"}),
    ("resource.k8s.io", "resourceslices"): frozenset({"list"}),
    ("resource.k8s.io", "resourceclaims"): frozenset({"list"}),
    ("resource.k8s.io", "deviceclasses"): frozenset({"list"}),
}

# Requests the operator must never be allowed (any scope it runs with).
DENIED: tuple[tuple[str, str], ...] = (
    ("get", "secrets"),
    ("list", "secrets"),
    ("watch", "secrets"),
    ("create", "pods"),
    ("create", "pods/exec"),
    ("delete", "nodes"),
    ("patch", "nodes"),
    ("delete", "memoryoptimizedtrainingjobs.memfit.dev"),
    ("create", "memoryoptimizedtrainingjobs.memfit.dev"),
    ("delete", "gpunodepools.memfit.dev"),
    ("create", "deployments.apps"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "namespaces"),
    ("create", "serviceaccounts/token"),
    ("impersonate", "users"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("*", "*"),
)


def expected_namespaced(values: Mapping[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    rules = dict(NAMESPACED)
    if values["kueue"]["enabled"]:
        rules |= KUEUE
    return rules


def expected_cluster(values: Mapping[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    rules = dict(CLUSTER)
    if values["kueue"]["enabled"]:
        rules |= KUEUE_CLUSTER
    if values["kueue"]["admissionCheck"]["enabled"]:
        for key, verbs in ADMISSION_CHECK.items():
            rules[key] = rules.get(key, frozenset()) | verbs
    return rules


def grants(rules: Rules) -> set[Grant]:
    return {(group, res, verb) for (group, res), verbs in rules.items() for verb in verbs}


def grants_of(policy_rules: Iterable[Mapping[str, Any]]) -> set[Grant]:
    """Flatten RBAC PolicyRules into (apiGroup, resource, verb) triples."""
    out: set[Grant] = set()
    for rule in policy_rules:
        for group in rule.get("apiGroups", []):
            for res in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((group, res, verb))
    return out


STANDARD_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def can_i_args(group: str, resource: str) -> list[str]:
    """`kubectl auth can-i` arguments after the verb: resource[.group] [--subresource=sub]."""
    base, _, sub = resource.partition("/")
    args = [f"{base}.{group}" if group else base]
    return [*args, f"--subresource={sub}"] if sub else args


def matrix(rules: Rules) -> list[tuple[str, str, str, bool]]:
    """(group, resource, verb, allowed) for every standard verb of every resource the rules mention."""
    return [(group, res, verb, verb in verbs) for (group, res), verbs in sorted(rules.items())
            for verb in STANDARD_VERBS]

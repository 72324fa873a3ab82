"""Spec values the CRD schema admits but Kubernetes refuses in the children memfit would create.

The API server validates a Job and its Pod template field by field; a MOTJ value copied there that
breaks those rules would make every create fail (a job stuck retrying) or leave half of the children
behind. Checked before any child exists, so the job fails at once as InvalidSpec, naming the field.
Rules from k8s.io/apimachinery validation: DNS-1123 subdomains
(IsDNS1123Subdomain: PriorityClass and PersistentVolumeClaim names), and container images (no
leading or trailing whitespace, core/v1 validation).
"""

from __future__ import annotations

import re

from memfit.api.job import MemoryOptimizedTrainingJobSpec

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_SUBDOMAIN_MAX = 253


def _subdomain(value: str) -> bool:
    return len(value) <= DNS_SUBDOMAIN_MAX and bool(DNS_SUBDOMAIN.match(value))


def child_field_problems(spec: MemoryOptimizedTrainingJobSpec) -> list[str]:
    """`field: why` for every spec value the Job or Pod memfit builds from it could not carry."""
    problems: list[str] = []
    if spec.image and (spec.image != spec.image.strip() or any(ch in spec.image for ch in "\n\r\t")):
        problems.append(
            "image: a container image must not contain tabs or newlines, nor start or end with spaces"
        )
    # scheduling.kueueQueue is checked by the API model (a LocalQueue name, hence a valid label value).
    priority = spec.scheduling.priority_class_name
    if priority and not _subdomain(priority):
        problems.append(
            "scheduling.priorityClassName: must be a PriorityClass name (DNS subdomain: lowercase letters, "
            "digits, '-' and '.')"
        )
    claim = spec.training.checkpoint.volume_claim
    if claim and not _subdomain(claim):
        problems.append(
            "training.checkpoint.volumeClaim: must be a PersistentVolumeClaim name (DNS subdomain: "
            "lowercase letters, digits, '-' and '.')"
        )
    output = spec.output.volume_claim if spec.output is not None else ""
    if output and not _subdomain(output):
        problems.append("output.volumeClaim: must be a PersistentVolumeClaim name (DNS subdomain: lowercase "
                        "letters, digits, '-' and '.')")
    pool = spec.profiling.node_pool
    if pool != "auto" and not _subdomain(pool):
        problems.append("profiling.nodePool: must be auto or a GPUNodePool name (DNS subdomain)")
    return problems

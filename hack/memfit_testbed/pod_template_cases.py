"""Pod templates that touch what memfit owns, each with the field the operator names and the start of its
message: refused by the operator's rules (tests/unit/api/test_pod_template_rules.py) and by the CRD's CEL
rules at admission (tests/integration/test_pod_template_admission.py)."""

from __future__ import annotations

from typing import Any

from memfit.api import pod as contract
from memfit.api.pod_template_rules import (
    ONE_SOURCE,
    OWNED_CONTAINER,
    OWNED_ENV,
    OWNED_METADATA,
    OWNED_MOUNT,
    OWNED_RESOURCE,
    OWNED_VOLUME,
    RESTART_POLICY,
    SECURITY_CONTEXT,
    UNKNOWN_VOLUME,
)

REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "memfit label": ({"labels": {"memfit.dev/job": "x"}}, "spec.podTemplate.labels[memfit.dev/job]", OWNED_METADATA),
    "kueue label": ({"labels": {"kueue.x-k8s.io/queue-name": "q"}},
                    "spec.podTemplate.labels[kueue.x-k8s.io/queue-name]", OWNED_METADATA),
    "job controller annotation": ({"annotations": {"batch.kubernetes.io/job-completion-index": "1"}},
                                  "spec.podTemplate.annotations[batch.kubernetes.io/job-completion-index]",
                                  OWNED_METADATA),
    "plan path env": ({"env": [{"name": contract.ENV_PLAN_PATH, "value": "/x"}]},
                      "spec.podTemplate.env[0].name", OWNED_ENV),
    "torchrun env": ({"env": [{"name": "A", "value": "1"}, {"name": contract.ENV_MASTER_ADDR, "value": "h"}]},
                     "spec.podTemplate.env[1].name", OWNED_ENV),
    "memfit volume name": ({"volumes": [{"name": "checkpoints", "emptyDir": {}}]},
                           "spec.podTemplate.volumes[0].name", OWNED_VOLUME),
    "source volume name": ({"volumes": [{"name": "source-0", "emptyDir": {}}]},
                           "spec.podTemplate.volumes[0].name", OWNED_VOLUME),
    "duplicate volume": ({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
                         "spec.podTemplate.volumes[1].name", OWNED_VOLUME),
    "two sources": ({"volumes": [{"name": "a", "emptyDir": {}, "secret": {"secretName": "s"}}]},
                    "spec.podTemplate.volumes[0]", ONE_SOURCE),
    "no source": ({"volumes": [{"name": "a"}]}, "spec.podTemplate.volumes[0]", ONE_SOURCE),
    "mount over checkpoints": ({"volumes": [{"name": "a", "emptyDir": {}}],
                                "volumeMounts": [{"name": "a", "mountPath": "/checkpoints/x"}]},
                               "spec.podTemplate.volumeMounts[0].mountPath", OWNED_MOUNT),
    "mount at the plan": ({"volumes": [{"name": "a", "emptyDir": {}}],
                           "volumeMounts": [{"name": "a", "mountPath": "/etc/memfit"}]},
                          "spec.podTemplate.volumeMounts[0].mountPath", OWNED_MOUNT),
    "relative mount": ({"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "x"}]},
                       "spec.podTemplate.volumeMounts[0].mountPath", OWNED_MOUNT),
    "mount of memfit's volume": ({"volumeMounts": [{"name": "checkpoints", "mountPath": "/ckpt"}]},
                                 "spec.podTemplate.volumeMounts[0].name", UNKNOWN_VOLUME),
    "sidecar mount of an unknown volume": (
        {"sidecars": [{"name": "s", "image": "i", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]},
        "spec.podTemplate.sidecars[0].volumeMounts[0].name", UNKNOWN_VOLUME),
    "sidecar named trainer": ({"sidecars": [{"name": "trainer", "image": "i"}]},
                              "spec.podTemplate.sidecars[0].name", OWNED_CONTAINER),
    "init container named fetch-model": ({"initContainers": [{"name": "fetch-model", "image": "i"}]},
                                         "spec.podTemplate.initContainers[0].name", OWNED_CONTAINER),
    "a name twice": ({"sidecars": [{"name": "a", "image": "i"}], "initContainers": [{"name": "a", "image": "i"}]},
                     "spec.podTemplate.initContainers[0].name", OWNED_CONTAINER),
    "privileged sidecar": ({"sidecars": [{"name": "s", "image": "i", "securityContext": {"privileged": True}}]},
                           "spec.podTemplate.sidecars[0].securityContext", SECURITY_CONTEXT),
    "init container restart policy": (
        {"initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always"}]},
        "spec.podTemplate.initContainers[0].restartPolicy", RESTART_POLICY),
    "sidecar asks for a GPU": ({"sidecars": [{"name": "s", "image": "i",
                                              "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
                               "spec.podTemplate.sidecars[0].resources.limits[nvidia.com/gpu]", OWNED_RESOURCE),
}

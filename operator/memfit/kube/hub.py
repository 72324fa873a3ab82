"""How pods reach a Hugging Face model's files: the hub's environment (token by reference, mirror
endpoint, cache folder) and, for the profiling pod, the model's own claim (pure manifests)."""

from __future__ import annotations

from memfit.api import pod as contract
from memfit.api.problem import HuggingFaceProblem
from memfit.kube.common import Manifest, PodSettings


def hub_env(hf: HuggingFaceProblem, pod: PodSettings, *, home: str) -> list[Manifest]:
    """HF_HOME, HF_TOKEN from the user's Secret (a reference, never the value) and HF_ENDPOINT (the
    chart's hub.endpoint: a mirror; absent: the hub itself)."""
    env: list[Manifest] = [{"name": contract.ENV_HF_HOME, "value": home}]
    if hf.token_secret_ref is not None:
        ref = hf.token_secret_ref
        env.append({"name": contract.ENV_HF_TOKEN, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    if pod.hub_endpoint:
        env.append({"name": contract.ENV_HF_ENDPOINT, "value": pod.hub_endpoint})
    return env


def profile_model_access(
    hf: HuggingFaceProblem | None, pod: PodSettings
) -> tuple[list[Manifest], list[Manifest], list[Manifest]]:
    """(mounts, volumes, env) the profiling pod needs to read a model's config.json when the job gives
    no inline config: the model's claim read-only, or the hub (config.json only, into /tmp). With an
    inline config the profiler reads nothing: the hub is off."""
    if hf is None:
        return [], [], []
    if hf.config is not None:
        return [], [], [{"name": contract.ENV_HF_HUB_OFFLINE, "value": "1"}]
    if hf.volume_claim is not None:
        mount = {"name": "model", "mountPath": f"{contract.VOLUMES_MOUNT}/{hf.volume_claim}", "readOnly": True}
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": hf.volume_claim, "readOnly": True}}
        env = [{"name": contract.ENV_VOLUMES_DIR, "value": contract.VOLUMES_MOUNT},
               {"name": contract.ENV_HF_HUB_OFFLINE, "value": "1"}]
        return [mount], [volume], env
    return [], [], hub_env(hf, pod, home=contract.PROFILE_HUB_CACHE)

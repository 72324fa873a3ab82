"""Thin, typed access to the API server: get, idempotent ensure (create, 409 = ours), status patches."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from memfit.api.common import API_GROUP, API_VERSION
from memfit.controller.kept_profiles import KeptProfiles
from memfit.controller.settled_pods import SettledPods
from memfit.controller.trainer_metrics import read_trainer_metrics
from memfit.controller.watched_jobs import WatchedJobs
from memfit.kube.profile_cache import CachedProfile, parse_profile_cache
from memfit.lifecycle.dra_capacity import DraInventory

log = logging.getLogger(__name__)

Manifest = dict[str, Any]
MOTJ_PLURAL = "memoryoptimizedtrainingjobs"
POOL_PLURAL = "gpunodepools"
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
FIELD_MANAGER = "memfit-memory-fit"  # server-side applies of the AdmissionCheck controller
MERGE_PATCH = "application/merge-patch+json"
# Where memfit creates each kind of child (KubeApi._create).
CREATED = {
    "Job": "/apis/batch/v1/namespaces/{namespace}/jobs",
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "Service": "/api/v1/namespaces/{namespace}/services",
    "PersistentVolumeClaim": "/api/v1/namespaces/{namespace}/persistentvolumeclaims",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
}
DRA = "/apis/resource.k8s.io/v1"
# Kept-alive connections beyond one per reconcile worker: the resync loop, the event posters, the pool
# snapshot and the AdmissionCheck's loop. A pool smaller than the threads using it drops (and later
# re-opens, with a TLS handshake) a connection whenever more threads than it holds are in a request.
SPARE_CONNECTIONS = 8


class ForeignObjectError(RuntimeError):
    """A child's name is taken by an object memfit does not own."""


@dataclass
class KubeApi:
    """The API clients memfit uses; one instance per operator process."""

    core: client.CoreV1Api
    batch: client.BatchV1Api
    custom: client.CustomObjectsApi
    # The operator's watched Jobs (set by its Runtime): get_job answers from them while they are trusted.
    watched_jobs: WatchedJobs | None = field(default=None, kw_only=True)
    # The operator's settled pod lists (set by its Runtime): list_job_pods reuses them.
    settled_pods: SettledPods | None = field(default=None, kw_only=True)
    # The operator's kept profile caches (set by its Runtime): profile_cache answers from them.
    kept_profiles: KeptProfiles | None = field(default=None, kw_only=True)

    @classmethod
    def from_client(cls, api_client: client.ApiClient | None = None, *, workers: int = 16) -> KubeApi:
        if api_client is None:
            config = client.Configuration.get_default_copy()
            config.connection_pool_maxsize = max(config.connection_pool_maxsize or 0, workers + SPARE_CONNECTIONS)
            api_client = client.ApiClient(config)
        return cls(
            client.CoreV1Api(api_client), client.BatchV1Api(api_client), client.CustomObjectsApi(api_client)
        )

    # --- reads -------------------------------------------------------------------------------------
    # Core and batch reads and every write of the reconcile path go through `_request` (dicts in and
    # out); the rest skip the client's model classes with `_preload_content=False` + orjson.loads:
    # deserialising into V1Pod/V1Job and back to dicts cost most of the operator's CPU at scale.
    def get_job(self, namespace: str, name: str) -> Manifest | None:
        """The Job as the operator's watch last showed it (controller.watched_jobs), else from the API
        server (and kept)."""
        watched = self.watched_jobs
        if watched is not None and (kept := watched.get(namespace, name)) is not None:
            return kept
        found = _or_none(lambda: self._request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"))
        if watched is not None and found is not None:
            watched.seen(found)
        elif watched is not None:
            watched.gone(namespace, name)
        return found

    def get_config_map(self, namespace: str, name: str) -> Manifest | None:
        return _or_none(lambda: self._request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}"))

    def profile_cache(self, namespace: str, name: str) -> CachedProfile | None:
        """The profile cache ConfigMap `name`, parsed; None when absent or unreadable
        (controller.kept_profiles keeps what was found)."""
        if self.kept_profiles is not None:
            return self.kept_profiles.read(namespace, name, self.get_config_map)
        return parse_profile_cache((self.get_config_map(namespace, name) or {}).get("data"))

    def get_claim(self, namespace: str, name: str) -> Manifest | None:
        return _or_none(
            lambda: self._request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")
        )

    def trainer_metrics(self, host: str, port: int, *, job: str) -> dict[str, float] | None:
        """Rank 0's progress series from a trainer's /metrics (the pod network, not the API server);
        None when unreachable or when the endpoint belongs to another job."""
        return read_trainer_metrics(f"http://{host}:{port}/metrics", job=job)

    def get_motj(self, namespace: str, name: str) -> Manifest | None:
        return _or_none(
            lambda: self.custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, MOTJ_PLURAL, name
            )
        )

    def list_motj_keys(self, namespace: str | None = None, page: int = 500) -> Iterator[tuple[str, str]]:
        """(namespace, name) of every MOTJ, read as metadata only (PartialObjectMetadataList): the resync
        needs no spec or status, and decoding whole jobs every few seconds cost most of its CPU."""
        token = ""
        while True:
            options: dict[str, Any] = {"limit": page, "_preload_content": False, "_headers": {"Accept": METADATA_ONLY}}
            if token:
                options["_continue"] = token
            if namespace is None:
                listing = self.custom.list_cluster_custom_object(API_GROUP, API_VERSION, MOTJ_PLURAL, **options)
            else:
                listing = self.custom.list_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, MOTJ_PLURAL, **options
                )
            result = _json(listing)
            for item in result.get("items") or []:
                meta = item.get("metadata") or {}
                yield str(meta.get("namespace", "")), str(meta.get("name", ""))
            token = (result.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def list_pods(self, namespace: str, selector: str) -> list[Manifest]:
        pods = self._request("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector})
        return list(pods.get("items") or [])

    def list_job_pods(self, namespace: str, selector: str, job: Manifest) -> list[Manifest]:
        """The pods of `job` (`selector`): a list read at this version of the Job in which every pod was
        settled is reused (controller.settled_pods), else they are listed."""
        kept = self.settled_pods.get(namespace, selector, job) if self.settled_pods is not None else None
        if kept is not None:
            return kept
        pods = self.list_pods(namespace, selector)
        if self.settled_pods is not None:
            self.settled_pods.keep(namespace, selector, job, pods)
        return pods

    def list_workloads(self, namespace: str, selector: str) -> list[Manifest]:
        """Kueue Workloads; none when Kueue is not installed (404) or the chart did not grant the read
        (403, `kueue.enabled` off): the Queued condition then says no more than that the Job waits."""
        try:
            listing = self.custom.list_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", namespace, "workloads", label_selector=selector,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status in (403, 404):
                return []
            raise
        return list(_json(listing).get("items") or [])

    def get_local_queue(self, namespace: str, name: str) -> Manifest | None:
        return self._kueue_get(lambda: self.custom.get_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", namespace, "localqueues", name, _preload_content=False))

    def get_cluster_queue(self, name: str) -> Manifest | None:
        return self._kueue_get(lambda: self.custom.get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", name, _preload_content=False))

    def list_cluster_queues(self) -> list[Manifest]:
        """Every ClusterQueue (a cohort's members lend each other quota); none without Kueue or the read."""
        return self._kueue_list(lambda: self.custom.list_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", _preload_content=False))

    def get_resource_flavor(self, name: str) -> Manifest | None:
        return self._kueue_get(lambda: self.custom.get_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "resourceflavors", name, _preload_content=False))

    def list_admission_checks(self) -> list[Manifest]:
        """Kueue AdmissionChecks (cluster-scoped); none without Kueue or without the read."""
        return self._kueue_list(lambda: self.custom.list_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "admissionchecks", _preload_content=False))

    def list_all_workloads(self) -> list[Manifest]:
        """Every Kueue Workload of the cluster; none without Kueue or without the read."""
        return self._kueue_list(lambda: self.custom.list_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "workloads", _preload_content=False))

    def apply_admission_check_status(self, name: str, conditions: list[Manifest]) -> None:
        """Server-side apply of an AdmissionCheck's status conditions (memfit's field manager)."""
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": name},
                "status": {"conditions": conditions}}
        self.custom.patch_cluster_custom_object_status(
            "kueue.x-k8s.io", "v1beta2", "admissionchecks", name, body, field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml")

    def apply_workload_check(self, namespace: str, name: str, check: Manifest) -> None:
        """Server-side apply of one entry of a Workload's `status.admissionChecks` (a map keyed by
        name: Kueue's own entries and fields are left alone)."""
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": name, "namespace": namespace}, "status": {"admissionChecks": [check]}}
        self.custom.patch_namespaced_custom_object_status(
            "kueue.x-k8s.io", "v1beta2", namespace, "workloads", name, body, field_manager=FIELD_MANAGER,
            force=True, _content_type="application/apply-patch+yaml")

    @staticmethod
    def _kueue_list(call: Any) -> list[Manifest]:
        try:
            return list(_json(call()).get("items") or [])
        except ApiException as error:
            if error.status in (403, 404):
                return []
            raise

    @staticmethod
    def _kueue_get(call: Any) -> Manifest | None:
        """A Kueue object, or None when it, or Kueue, is absent (404) or not readable (403)."""
        try:
            return _json(call())
        except ApiException as error:
            if error.status in (403, 404):
                return None
            raise

    def list_pools(self) -> list[Manifest]:
        listing = self.custom.list_cluster_custom_object(
            API_GROUP, API_VERSION, POOL_PLURAL, _preload_content=False
        )
        return list(_json(listing).get("items") or [])

    def list_nodes(self) -> list[Manifest]:
        return list(self._request("GET", "/api/v1/nodes").get("items") or [])

    def list_dra(self) -> DraInventory:
        """What DRA pools are counted from: every ResourceSlice, the allocated ResourceClaims and the
        DeviceClass names (memfit.lifecycle.dra_capacity)."""
        slices = self._request("GET", f"{DRA}/resourceslices").get("items") or []
        claims = self._request("GET", f"{DRA}/resourceclaims").get("items") or []
        classes = self._request("GET", f"{DRA}/deviceclasses").get("items") or []
        return DraInventory(slices=list(slices), claims=[c for c in claims if (c.get("status") or {}).get("allocation")],
                            device_classes=frozenset(str(c["metadata"]["name"]) for c in classes))

    def list_active_pods(self) -> list[Manifest]:
        """Pods bound to a node and not finished, in every namespace: the ones that hold GPUs."""
        selector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        return list(self._request("GET", "/api/v1/pods", query={"fieldSelector": selector}).get("items") or [])

    # --- writes ------------------------------------------------------------------------------------
    def ensure(self, manifest: Manifest) -> tuple[Manifest, bool]:
        """Create the object; on 409 return the existing one if memfit owns it. Returns (object, created)."""
        kind = manifest["kind"]
        namespace = manifest["metadata"].get("namespace", "")
        name = manifest["metadata"]["name"]
        try:
            created = self._create(kind, namespace, manifest)
        except ApiException as error:
            if error.status != 409:
                raise
        else:
            if kind == "Job" and self.watched_jobs is not None:
                self.watched_jobs.seen(created)  # the server's answer: the next pass need not GET it
            if kind == "ConfigMap" and self.kept_profiles is not None:
                self.kept_profiles.written(namespace, name)
            return created, True
        existing = self._read(kind, namespace, name)
        if existing is None:  # deleted between create and read: next reconcile creates it
            raise ApiException(status=409, reason=f"{kind} {namespace}/{name} is being deleted")
        wanted = {r.get("uid") for r in manifest["metadata"].get("ownerReferences", [])}
        owners = {r.get("uid") for r in existing.get("metadata", {}).get("ownerReferences") or []}
        if wanted and not wanted & owners:
            raise ForeignObjectError(f"{kind} {namespace}/{name} exists and is not owned by this job")
        return existing, False

    def replace_config_map_data(self, namespace: str, name: str, data: dict[str, str]) -> None:
        try:
            self.core.patch_namespaced_config_map(name, namespace, {"data": data})
        finally:
            if self.kept_profiles is not None:
                self.kept_profiles.written(namespace, name)

    def delete_job(self, namespace: str, name: str) -> None:
        try:
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except ApiException as error:
            if error.status != 404:
                raise
        if self.watched_jobs is not None:
            self.watched_jobs.gone(namespace, name)

    def patch_motj_status(
        self, namespace: str, name: str, status: Manifest, resource_version: str
    ) -> Manifest:
        """Merge-patch the status subresource, guarded by resourceVersion (409 on a concurrent write)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        path = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{MOTJ_PLURAL}/{name}/status"
        return self._request("PATCH", path, body=body, content_type=MERGE_PATCH)

    def patch_pool_status(self, name: str, status: Manifest) -> None:
        self.custom.patch_cluster_custom_object_status(
            API_GROUP, API_VERSION, POOL_PLURAL, name, {"status": status}
        )

    def create_event(self, event: Manifest) -> None:
        self._request("POST", f"/api/v1/namespaces/{event['metadata']['namespace']}/events", body=event)

    # --- helpers -----------------------------------------------------------------------------------
    def _create(self, kind: str, namespace: str, manifest: Manifest) -> Manifest:
        collection = CREATED.get(kind)
        if collection is None:
            raise ValueError(f"memfit does not create {kind}")
        return self._request("POST", collection.format(namespace=namespace), body=manifest)

    def _request(
        self, method: str, path: str, *, body: Manifest | None = None, query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Manifest:
        """One request with a JSON body and answer, as dicts: the client's URL, TLS and credentials
        (a refreshed service-account token included), without its generated methods, which validate a
        dict body into pydantic models (V1Job, CoreV1Event) and serialise it back, and decode answers
        into them: that round trip was a fifth of the operator's CPU in a burst of launches."""
        api_client = self.core.api_client
        method, url, headers, _, _ = api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()) if query else None,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            auth_settings=["BearerToken"],
        )
        response = api_client.rest_client.request(method, url, headers=headers, body=body)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return _json(response)

    def _read(self, kind: str, namespace: str, name: str) -> Manifest | None:
        if kind == "Job":
            return self.get_job(namespace, name)
        if kind == "ConfigMap":
            return self.get_config_map(namespace, name)
        if kind == "Service":
            return _or_none(
                lambda: _json(self.core.read_namespaced_service(name, namespace, _preload_content=False))
            )
        if kind == "PersistentVolumeClaim":
            return self.get_claim(namespace, name)
        if kind == "ResourceClaimTemplate":
            return _or_none(lambda: self._request("GET", f"{DRA}/namespaces/{namespace}/resourceclaimtemplates/{name}"))
        raise ValueError(f"memfit does not read {kind}")


def _json(response: Any) -> Manifest:
    """The body of a `_preload_content=False` response as a dict (camelCase, as the API server sent it).
    orjson decodes the bytes about twice as fast as the standard library: decoding answers was a tenth
    of the operator's CPU at 1,000 jobs (py-spy during benchmarks/scale.py)."""
    result: Manifest = orjson.loads(response.data)
    return result


def _or_none(read: Any) -> Manifest | None:
    try:
        result: Manifest = read()
        return result
    except ApiException as error:
        if error.status == 404:
            return None
        raise

{{/* RBAC rules of the operator, shared by the ClusterRole (all namespaces) and the per-namespace Roles
(operator.watchNamespaces). Least privilege: explicit verbs and resources, no wildcards, no Secrets. */}}

{{/* Rules on namespaced resources: the jobs it reconciles and the children it owns. */}}
{{- define "memfit.rbac.namespacedRules" -}}
- apiGroups: [memfit.dev]
  resources: [memoryoptimizedtrainingjobs]
  verbs: [get, list, watch, patch, update]
- apiGroups: [memfit.dev]
  resources: [memoryoptimizedtrainingjobs/status]
  verbs: [get, patch, update]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, patch, delete]
{{- /* pods: read for profiler results and OOM reasons; delete pre-empted and profiler pods. */}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
{{- /* plan ConfigMaps, profile cache ConfigMaps, headless Services of training jobs. */}}
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [create, get, list, watch, patch, delete]
{{- /* the per-job checkpoint claims (<job>-checkpoints, owned by the job); get: a named claim's access modes. */}}
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [create, get]
{{- /* kopf posts core v1 Events. */}}
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- /* a DRA pool's device claims: one ResourceClaimTemplate per attempt (owned by the job, docs/dra.md). */}}
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [create, get]
{{- if .Values.kueue.enabled }}
{{- /* Workloads: the Queued condition; LocalQueues: the ClusterQueue whose quota planning respects. */}}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads, localqueues]
  verbs: [get, list, watch]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped resources (always in the ClusterRole). */}}
{{- define "memfit.rbac.clusterRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- /* create: `memfit pools discover` from GPU Feature Discovery labels; patch: kopf annotations. */}}
- apiGroups: [memfit.dev]
  resources: [gpunodepools]
  verbs: [get, list, watch, patch, create]
- apiGroups: [memfit.dev]
  resources: [gpunodepools/status]
  verbs: [get, patch, update]
{{- /* DRA pools' capacity: the devices drivers publish, the claims that hold them, the classes that exist. */}}
- apiGroups: [resource.k8s.io]
  resources: [resourceslices, resourceclaims, deviceclasses]
  verbs: [list]
{{- /* kopf watches CRDs and namespaces to follow its resources. */}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- if .Values.kueue.enabled }}
{{- /* ClusterQueues (cluster-scoped): GPU quota per flavor for quota-aware planning (docs/kueue.md). */}}
- apiGroups: [kueue.x-k8s.io]
  resources: [clusterqueues]
  verbs: [get, list, watch]
{{- end }}
{{- if .Values.kueue.admissionCheck.enabled }}
{{- /* The memfit.dev/memory-fit AdmissionCheck controller answers Workloads of every namespace. */}}
- apiGroups: [kueue.x-k8s.io]
  resources: [admissionchecks, workloads]
  verbs: [get, list]
- apiGroups: [kueue.x-k8s.io]
  resources: [admissionchecks/status, workloads/status]
  verbs: [patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, clusterqueues]
  verbs: [get]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
{{- end }}
{{- end }}

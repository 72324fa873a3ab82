{{/* Helpers for the memfit chart. Names follow `helm create`; every helper is prefixed `memfit.`. */}}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "memfit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: fullnameOverride, else <release>-<name> unless the release name already contains it. */}}
{{- define "memfit.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "memfit.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of the operator pod (stable across upgrades). */}}
{{- define "memfit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memfit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Standard labels on every object; pass a dict with "ctx" (root) and optional "component". */}}
{{- define "memfit.labels" -}}
{{- $ctx := .ctx -}}
helm.sh/chart: {{ include "memfit.chart" $ctx }}
app.kubernetes.io/name: {{ include "memfit.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
app.kubernetes.io/part-of: memfit
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "memfit.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memfit.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] from an image dict; pass a dict with "image" and "ctx". */}}
{{- define "memfit.imageRef" -}}
{{- $img := .image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .ctx.Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{/* Name of the metrics Service (the ServiceMonitor and the helm test use it). */}}
{{- define "memfit.metricsServiceName" -}}
{{- printf "%s-metrics" (include "memfit.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Scrape job name of the operator: the alerts and the dashboard query up{job="memfit-operator"}. */}}
{{- define "memfit.scrapeJob" -}}
memfit-operator
{{- end }}

{{/* A map as "k1=v1,k2=v2", sorted by key (the operator's MEMFIT_EXTRA_POD_LABELS format). */}}
{{- define "memfit.kvList" -}}
{{- $pairs := list }}
{{- range $k := keys . | sortAlpha }}
{{- $pairs = append $pairs (printf "%s=%v" $k (index $ $k)) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* "true" when this upgrade adopts a GPUNodePool that the install created as a post-install hook: the
first upgrade (revision 2) finds it in the cluster, still carrying the hook annotation. Pass a dict with
"ctx" (root) and "live" (the lookup result, or an empty dict). */}}
{{- define "memfit.adoptingPool" -}}
{{- $annotations := dig "metadata" "annotations" dict .live }}
{{- if and .ctx.Release.IsUpgrade (eq (int .ctx.Release.Revision) 2) (hasKey $annotations "helm.sh/hook") }}true{{ end }}
{{- end }}

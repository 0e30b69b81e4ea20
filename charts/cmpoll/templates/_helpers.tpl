{{/* The hub's name: the release's, with -hub (cmpoll-hub for a release named cmpoll). */}}
{{- define "cmpoll.hub" -}}
{{- printf "%s-hub" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The webhook's name: the release's, with -webhook. */}}
{{- define "cmpoll.webhook" -}}
{{- printf "%s-webhook" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries (Helm's recommended ones) but its name. */}}
{{- define "cmpoll.common" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The hub's objects' labels, and what selects its pods. */}}
{{- define "cmpoll.labels" -}}
app.kubernetes.io/name: {{ include "cmpoll.hub" . }}
{{ include "cmpoll.common" . }}
{{- end -}}
{{- define "cmpoll.hub.selector" -}}
app.kubernetes.io/name: {{ include "cmpoll.hub" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The webhook's objects' labels, and what selects its pods. */}}
{{- define "cmpoll.webhook.labels" -}}
app.kubernetes.io/name: {{ include "cmpoll.webhook" . }}
{{ include "cmpoll.common" . }}
{{- end -}}
{{- define "cmpoll.webhook.selector" -}}
app.kubernetes.io/name: {{ include "cmpoll.webhook" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cmpoll.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

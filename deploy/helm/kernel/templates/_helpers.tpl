{{/* The chart's name, the release's full name, and the labels every object carries. */}}
{{- define "kernel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kernel.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kernel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kernel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kernel.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kernel.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* A ConfigMap key for a repository path: keys allow [-._a-zA-Z0-9] only, so the file's base
name plus a hash of its whole path. */}}
{{- define "kernel.configMapKey" -}}
{{- printf "%s-%s" (regexReplaceAll "[^-._a-zA-Z0-9]" (base .) "_") (sha256sum . | trunc 10) -}}
{{- end -}}

{{- define "kernel.claimName" -}}
{{- .Values.modelRepository.pvc.claimName | default (printf "%s-models" (include "kernel.fullname" .)) -}}
{{- end -}}

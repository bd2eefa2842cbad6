{{/* Name prefix of every object: the release name when it contains "gpufleet", else "<release>-gpufleet". */}}
{{- define "gpufleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpufleet.operator" -}}{{ include "gpufleet.fullname" . }}-operator{{- end -}}
{{- define "gpufleet.agent" -}}{{ include "gpufleet.fullname" . }}-agent{{- end -}}

{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpufleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: gpufleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gpufleet.operatorSelector" -}}
app.kubernetes.io/name: gpufleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpufleet.agentSelector" -}}
app.kubernetes.io/name: gpufleet-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The rules of a kind (ClusterRole or Role) in files/role.yaml, the copy of the
RBAC that controller-gen generates from the code's markers.
*/}}
{{- define "gpufleet.generatedRules" -}}
{{- $kind := .kind -}}
{{- $found := false -}}
{{- range $doc := splitList "\n---\n" (printf "\n%s" (.root.Files.Get "files/role.yaml")) -}}
{{- $o := fromYaml $doc -}}
{{- if and $o (eq (get $o "kind") $kind) -}}
{{- $found = true -}}
{{- toYaml (get $o "rules") -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "files/role.yaml has no %s: run make generate" $kind) -}}
{{- end -}}
{{- end -}}

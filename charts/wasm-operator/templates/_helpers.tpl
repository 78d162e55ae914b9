{{/* The release's full name: the release name, with the chart's name when it is not in it. */}}
{{- define "wasm-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "wasm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "wasm-operator.labels" -}}
{{ include "wasm-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "wasm-operator.serviceAccountName" -}}
{{- default (include "wasm-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "wasm-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
An API group of the generated files (written for the default group, hanzo.ai) moved to
.Values.apiGroup: hanzo.ai itself, and its subgroups such as kms.hanzo.ai.
*/}}
{{- define "wasm-operator.group" -}}
{{- $group := index . 0 -}}
{{- $to := index . 1 -}}
{{- if eq $group "hanzo.ai" -}}
{{- $to -}}
{{- else if hasSuffix ".hanzo.ai" $group -}}
{{- printf "%s.%s" (trimSuffix ".hanzo.ai" $group) $to -}}
{{- else -}}
{{- $group -}}
{{- end -}}
{{- end -}}

{{/* The documents of a generated multi-document YAML file, parsed. */}}
{{- define "wasm-operator.documents" -}}
{{- $docs := list -}}
{{- range $text := splitList "\n---\n" (printf "\n%s" .) -}}
{{- $doc := fromYaml $text -}}
{{- if $doc.kind -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

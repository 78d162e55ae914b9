{{/* The chart's name, or nameOverride. */}}
{{- define "wasm-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The release's full name: fullnameOverride when given; else the release name, with the chart's
name (or nameOverride) when it is not in it.
*/}}
{{- define "wasm-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "wasm-operator.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "wasm-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wasm-operator.name" . }}
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

{{/*
A size (such as 64Mi, 64MiB, 512Ki, 1Gi or a number of bytes), in KiB, as `host` reads its size
flags; bytes are rounded up to whole KiB.
*/}}
{{- define "wasm-operator.kibibytes" -}}
{{- $v := trimSuffix "B" (toString .) -}}
{{- if regexMatch "^[0-9]+Gi$" $v -}}{{ mul (trimSuffix "Gi" $v | atoi) 1048576 }}
{{- else if regexMatch "^[0-9]+Mi$" $v -}}{{ mul (trimSuffix "Mi" $v | atoi) 1024 }}
{{- else if regexMatch "^[0-9]+Ki$" $v -}}{{ trimSuffix "Ki" $v | atoi }}
{{- else if regexMatch "^[0-9]+$" $v -}}{{ div (add (atoi $v) 1023) 1024 }}
{{- else -}}{{ fail (printf "%q is not a size such as 64Mi (units: Ki, Mi, Gi)" (toString .)) }}
{{- end -}}
{{- end -}}

{{/*
KiB written as Mi when whole, else as Ki.
*/}}
{{- define "wasm-operator.size" -}}
{{- if eq (mod (int .) 1024) 0 -}}{{ div (int .) 1024 }}Mi{{- else -}}{{ . }}Ki{{- end -}}
{{- end -}}

{{/*
The memory budget of plugin calls in flight (host run --render-memory), in KiB: room for
sandbox.callsInFlight calls, each counted as host counts it, its memory cap and four times its
output cap (OUTPUT_COPIES in host/src/plugin/mod.rs).
*/}}
{{- define "wasm-operator.renderMemoryKi" -}}
{{- $memory := include "wasm-operator.kibibytes" .Values.sandbox.memory | atoi -}}
{{- $output := include "wasm-operator.kibibytes" .Values.sandbox.output | atoi -}}
{{- $calls := int .Values.sandbox.callsInFlight -}}
{{- if lt $calls 1 -}}{{ fail "sandbox.callsInFlight must be 1 or more" }}{{- end -}}
{{- mul $calls (add $memory (mul 4 $output)) -}}
{{- end -}}

{{/*
The container's resources: .Values.resources, with limits.memory, when not given, derived as
baseMemory plus the budget of plugin calls in flight plus one plugin's compile.
*/}}
{{- define "wasm-operator.resources" -}}
{{- $resources := deepCopy .Values.resources -}}
{{- $limits := dig "limits" dict $resources -}}
{{- if not (get $limits "memory") -}}
{{- $base := include "wasm-operator.kibibytes" .Values.baseMemory | atoi -}}
{{- $calls := include "wasm-operator.renderMemoryKi" . | atoi -}}
{{- $compile := include "wasm-operator.kibibytes" .Values.sandbox.compileMemory | atoi -}}
{{- $_ := set $limits "memory" (include "wasm-operator.size" (add $base $calls $compile)) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

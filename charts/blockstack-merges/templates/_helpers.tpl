{{/* Names and labels, as prometheus-community charts write them. */}}
{{- define "blockstack-merges.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "blockstack-merges.fullname" -}}
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

{{- define "blockstack-merges.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "blockstack-merges.selectorLabels" -}}
app.kubernetes.io/name: {{ include "blockstack-merges.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "blockstack-merges.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "blockstack-merges.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: blockstack-merges
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "blockstack-merges.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "blockstack-merges.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "blockstack-merges.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The scrape jobs: {port name: job label}, the jobs the mixin's rules select. */}}
{{- define "blockstack-merges.jobs" -}}
{{- $jobs := dict }}
{{- if .Values.ebpf.enabled }}{{ $_ := set $jobs "ebpf" "ebpf" }}{{ end }}
{{- if .Values.blockstack.enabled }}{{ $_ := set $jobs "blockstack" "blockstack" }}{{ end }}
{{- if .Values.nodeExporter.enabled }}{{ $_ := set $jobs "node" "node" }}{{ end }}
{{- toYaml $jobs }}
{{- end }}

{{/* What every scraped target gets: the job its rules select and `host`, the node's name. */}}
{{- define "blockstack-merges.relabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: host
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: instance
- targetLabel: job
  replacement: {{ .job }}
{{- end }}

{{/* A file of files/mixin/ (make chart), or a failure naming how to make it. */}}
{{- define "blockstack-merges.mixinFile" -}}
{{- $text := .root.Files.Get (printf "files/mixin/%s" .file) }}
{{- if not $text }}
{{- fail (printf "files/mixin/%s is missing: run `make chart` in the repository (it copies what `make mixin` renders)" .file) }}
{{- end }}
{{- $text }}
{{- end }}

{{/* The mixin's text with the node_exporter job the rules select (prometheusRule.nodeJob). */}}
{{- define "blockstack-merges.withNodeJob" -}}
{{- $job := .root.Values.prometheusRule.nodeJob | default (ternary "node" "node-exporter" .root.Values.nodeExporter.enabled) }}
{{- .text | replace "job=\"node\"" (printf "job=\"%s\"" $job) | replace "job=~\"node|" (printf "job=~\"%s|" $job) | replace "job=\\\"node\\\"" (printf "job=\\\"%s\\\"" $job) }}
{{- end }}

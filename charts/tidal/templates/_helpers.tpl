{{/*
Names, labels, the image, the connection Secrets and the pod settings every workload shares.
*/}}

{{- define "tidal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name; component names append -controller, -gateway, -billing. */}}
{{- define "tidal.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tidal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "gateway"). */}}
{{- define "tidal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidal.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects. */}}
{{- define "tidal.labels" -}}
helm.sh/chart: {{ include "tidal.chart" .ctx }}
{{ include "tidal.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: tidal
{{- end }}

{{- define "tidal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret the chart creates for the URLs and the admin token given as values. */}}
{{- define "tidal.secretName" -}}
{{- printf "%s-connections" (include "tidal.fullname" .) }}
{{- end }}

{{- define "tidal.postgresql.secretName" -}}
{{- if .Values.postgresql.existingSecret }}
{{- .Values.postgresql.existingSecret }}
{{- else }}
{{- $_ := required "set postgresql.url or postgresql.existingSecret" .Values.postgresql.url }}
{{- include "tidal.secretName" . }}
{{- end }}
{{- end }}

{{- define "tidal.postgresql.secretKey" -}}
{{- if .Values.postgresql.existingSecret }}{{ .Values.postgresql.existingSecretKey }}{{ else }}database-url{{ end }}
{{- end }}

{{- define "tidal.redis.secretName" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else }}
{{- $_ := required "set redis.url or redis.existingSecret" .Values.redis.url }}
{{- include "tidal.secretName" . }}
{{- end }}
{{- end }}

{{- define "tidal.redis.secretKey" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecretKey }}{{ else }}redis-url{{ end }}
{{- end }}

{{/* Environment of every role: the ledger and Redis URLs from their Secrets (the flags
`--database`/`--ledger` and `--redis` read TIDAL_DATABASE_URL and TIDAL_REDIS_URL). */}}
{{- define "tidal.connectionEnv" -}}
- name: TIDAL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tidal.postgresql.secretName" . }}
      key: {{ include "tidal.postgresql.secretKey" . }}
- name: TIDAL_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tidal.redis.secretName" . }}
      key: {{ include "tidal.redis.secretKey" . }}
{{- end }}

{{/* Pod metadata annotations: restart pods when the chart's Secret changes. */}}
{{- define "tidal.podAnnotations" -}}
checksum/connections: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes every tidal container mounts: a writable /tmp on a read-only root. */}}
{{- define "tidal.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{- define "tidal.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}
